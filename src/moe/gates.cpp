#include "moe/gates.hpp"

#include <cmath>

#include "util/random.hpp"
#include "xmoe/error.hpp"

namespace xmoe::moe {

namespace {

Parameter& add_param(std::vector<std::unique_ptr<Parameter>>& params, const std::string& name,
                     const Shape& shape, DType dtype) {
  auto p = std::make_unique<Parameter>();
  p->name = name;
  p->value = Tensor::zeros(shape, dtype);
  p->grad = Tensor::zeros(shape, dtype == DType::f64 ? DType::f64 : DType::f32);
  p->is_expert = false;
  params.push_back(std::move(p));
  return *params.back();
}

void fill_uniform(Tensor& t, double bound, uint64_t seed, uint64_t stream) {
  CounterRng rng(seed, stream);
  for (int64_t i = 0; i < t.numel(); ++i)
    t.set(i, (2.0 * rng.uniform(static_cast<uint64_t>(i)) - 1.0) * bound);
}

// Parameters in the accumulation type: a view for f32/f64, a converted copy for bf16.
template <class S>
const acc_t<S>* as_acc(const Ops<S>& ops, const S* p, int64_t n, Buffer<acc_t<S>>& scratch) {
  if constexpr (std::is_same_v<S, acc_t<S>>) {
    return p;
  } else {
    acc_t<S>* out = scratch.ensure(static_cast<size_t>(n));
    ops.to_acc(p, out, n);
    return out;
  }
}

template <class S>
class TopGate final : public Gate<S> {
 public:
  using Acc = acc_t<S>;
  TopGate(const MoeConfig& c, std::vector<std::unique_ptr<Parameter>>& params)
      : M_(c.model_dim),
        E_(c.experts.num_experts),
        round_logits_(!c.gate.fp32_gate && c.dtype == DType::bf16) {
    wg_ = &add_param(params, "gate.wg", {E_, M_}, c.dtype);
    fill_uniform(wg_->value, 1.0 / std::sqrt(static_cast<double>(M_)), c.seed_gate, 0);
  }
  void forward(const Ops<S>& ops, const S* x, int64_t T, Acc* logits) override {
    ops.gemm(gemm_args<S, Acc>(T, E_, M_, x, M_, false, wg_->value.data<S>(), M_, true, logits, E_, false));
    if (round_logits_)  // fp32_gate off: the gate's output is bf16, as in a bf16 Linear
      for (int64_t i = 0; i < T * E_; ++i)
        logits[i] = static_cast<float>(bf16(static_cast<float>(logits[i])));
  }
  void backward(const Ops<S>& ops, const S* x, int64_t T, const Acc* dlogits, Acc* dx) override {
    const Acc* xa = as_acc(ops, x, T * M_, x_acc_);
    const Acc* wa = as_acc(ops, wg_->value.data<S>(), E_ * M_, w_acc_);
    Acc* dw = wg_->grad.data<Acc>();
    ops.gemm_acc(gemm_args<Acc, Acc>(E_, M_, T, dlogits, E_, true, xa, M_, false, dw, M_, true));
    ops.gemm_acc(gemm_args<Acc, Acc>(T, M_, E_, dlogits, E_, false, wa, M_, false, dx, M_, true));
  }
  size_t workspace_bytes() const override { return x_acc_.bytes() + w_acc_.bytes(); }

 private:
  int64_t M_, E_;
  bool round_logits_;
  Parameter* wg_;
  Buffer<Acc> x_acc_, w_acc_;
};

// Cosine router: logits = normalize(x Pᵀ, rows) · normalize(S, columns) · exp(min(τ, ln 100)).
template <class S>
class CosineTopGate final : public Gate<S> {
 public:
  using Acc = acc_t<S>;
  static constexpr double kNormEps = 1e-12;  // torch.nn.functional.normalize's default

  CosineTopGate(const MoeConfig& c, std::vector<std::unique_ptr<Parameter>>& params)
      : M_(c.model_dim), E_(c.experts.num_experts), P_(c.gate.proj_dim) {
    proj_ = &add_param(params, "gate.cosine_projector", {P_, M_}, c.dtype);
    sim_ = &add_param(params, "gate.sim_matrix", {P_, E_}, c.dtype);
    temp_ = &add_param(params, "gate.temperature", {1}, c.dtype);
    fill_uniform(proj_->value, 1.0 / std::sqrt(static_cast<double>(M_)), c.seed_gate, 0);
    CounterRng rng(c.seed_gate, 1);
    for (int64_t i = 0; i < sim_->value.numel(); ++i)
      sim_->value.set(i, 0.01 * rng.normal(static_cast<uint64_t>(i)));
    temp_->value.set(0, std::log(1.0 / c.gate.init_t));
  }

  void forward(const Ops<S>& ops, const S* x, int64_t T, Acc* logits) override {
    Acc* p = proj_out_.ensure(static_cast<size_t>(T * P_));
    Acc* pn = proj_norm_.ensure(static_cast<size_t>(T * P_));
    Acc* rn = row_norm_.ensure(static_cast<size_t>(T));
    ops.gemm(gemm_args<S, Acc>(T, P_, M_, x, M_, false, proj_->value.data<S>(), M_, true, p, P_, false));
    for (int64_t t = 0; t < T; ++t) {
      double ss = 0;
      for (int64_t i = 0; i < P_; ++i) ss += static_cast<double>(p[t * P_ + i]) * p[t * P_ + i];
      rn[t] = static_cast<Acc>(std::sqrt(ss));
      const Acc d = std::max<Acc>(rn[t], static_cast<Acc>(kNormEps));
      for (int64_t i = 0; i < P_; ++i) pn[t * P_ + i] = p[t * P_ + i] / d;
    }
    const Acc* s = as_acc(ops, sim_->value.data<S>(), P_ * E_, sim_acc_);
    Acc* sn = sim_norm_.ensure(static_cast<size_t>(P_ * E_));
    Acc* cn = col_norm_.ensure(static_cast<size_t>(E_));
    for (int64_t e = 0; e < E_; ++e) {
      double ss = 0;
      for (int64_t i = 0; i < P_; ++i) ss += static_cast<double>(s[i * E_ + e]) * s[i * E_ + e];
      cn[e] = static_cast<Acc>(std::sqrt(ss));
      const Acc d = std::max<Acc>(cn[e], static_cast<Acc>(kNormEps));
      for (int64_t i = 0; i < P_; ++i) sn[i * E_ + e] = s[i * E_ + e] / d;
    }
    ops.gemm_acc(gemm_args<Acc, Acc>(T, E_, P_, pn, P_, false, sn, E_, false, logits, E_, false));
    const Acc scale = static_cast<Acc>(std::exp(std::min<double>(temp_->value.get(0), std::log(100.0))));
    for (int64_t i = 0; i < T * E_; ++i) logits[i] *= scale;
  }

  void backward(const Ops<S>& ops, const S* x, int64_t T, const Acc* dlogits, Acc* dx) override {
    const double tau = temp_->value.get(0);
    const Acc scale = static_cast<Acc>(std::exp(std::min<double>(tau, std::log(100.0))));
    const Acc* pn = proj_norm_.data();
    const Acc* sn = sim_norm_.data();
    // dτ = Σ dlogits ⊙ (pn·sn) · scale, passed only while τ is below the clamp (torch.clamp's gradient).
    Acc* raw = scratch_.ensure(static_cast<size_t>(T * E_));
    ops.gemm_acc(gemm_args<Acc, Acc>(T, E_, P_, pn, P_, false, sn, E_, false, raw, E_, false));
    if (tau <= std::log(100.0)) {
      double dt = 0;
      for (int64_t i = 0; i < T * E_; ++i) dt += static_cast<double>(dlogits[i]) * raw[i];
      temp_->grad.data<Acc>()[0] += static_cast<Acc>(dt * scale);
    }
    Acc* dl = scaled_dl_.ensure(static_cast<size_t>(T * E_));
    for (int64_t i = 0; i < T * E_; ++i) dl[i] = dlogits[i] * scale;
    Acc* dpn = dpn_.ensure(static_cast<size_t>(T * P_));
    ops.gemm_acc(gemm_args<Acc, Acc>(T, P_, E_, dl, E_, false, sn, E_, true, dpn, P_, false));
    Acc* dsn = dsn_.ensure(static_cast<size_t>(P_ * E_));
    ops.gemm_acc(gemm_args<Acc, Acc>(P_, E_, T, pn, P_, true, dl, E_, false, dsn, E_, false));
    // Through the normalisations: d(v/|v|) = (dn − n(n·dn)) / |v| while |v| > eps, else dn / eps.
    const Acc* rn = row_norm_.data();
    for (int64_t t = 0; t < T; ++t) {
      Acc* d = dpn + t * P_;
      const Acc* n = pn + t * P_;
      if (rn[t] > kNormEps) {
        double dot = 0;
        for (int64_t i = 0; i < P_; ++i) dot += static_cast<double>(n[i]) * d[i];
        for (int64_t i = 0; i < P_; ++i) d[i] = (d[i] - n[i] * static_cast<Acc>(dot)) / rn[t];
      } else {
        for (int64_t i = 0; i < P_; ++i) d[i] /= static_cast<Acc>(kNormEps);
      }
    }
    const Acc* cn = col_norm_.data();
    Acc* dsim = sim_->grad.data<Acc>();
    for (int64_t e = 0; e < E_; ++e) {
      if (cn[e] > kNormEps) {
        double dot = 0;
        for (int64_t i = 0; i < P_; ++i) dot += static_cast<double>(sn[i * E_ + e]) * dsn[i * E_ + e];
        for (int64_t i = 0; i < P_; ++i)
          dsim[i * E_ + e] += (dsn[i * E_ + e] - sn[i * E_ + e] * static_cast<Acc>(dot)) / cn[e];
      } else {
        for (int64_t i = 0; i < P_; ++i) dsim[i * E_ + e] += dsn[i * E_ + e] / static_cast<Acc>(kNormEps);
      }
    }
    const Acc* xa = as_acc(ops, x, T * M_, x_acc_);
    const Acc* wa = as_acc(ops, proj_->value.data<S>(), P_ * M_, w_acc_);
    ops.gemm_acc(
        gemm_args<Acc, Acc>(P_, M_, T, dpn, P_, true, xa, M_, false, proj_->grad.data<Acc>(), M_, true));
    ops.gemm_acc(gemm_args<Acc, Acc>(T, M_, P_, dpn, P_, false, wa, M_, false, dx, M_, true));
  }

  size_t workspace_bytes() const override {
    return proj_out_.bytes() + proj_norm_.bytes() + row_norm_.bytes() + sim_acc_.bytes() + sim_norm_.bytes() +
           col_norm_.bytes() + scratch_.bytes() + scaled_dl_.bytes() + dpn_.bytes() + dsn_.bytes() +
           x_acc_.bytes() + w_acc_.bytes();
  }

 private:
  int64_t M_, E_, P_;
  Parameter *proj_, *sim_, *temp_;
  Buffer<Acc> proj_out_, proj_norm_, row_norm_, sim_acc_, sim_norm_, col_norm_;
  Buffer<Acc> scratch_, scaled_dl_, dpn_, dsn_, x_acc_, w_acc_;
};

}  // namespace

template <class S>
std::unique_ptr<Gate<S>> make_gate(const MoeConfig& config, std::vector<std::unique_ptr<Parameter>>& params) {
  if (config.gate.type == "top") return std::make_unique<TopGate<S>>(config, params);
  if (config.gate.type == "cosine_top") return std::make_unique<CosineTopGate<S>>(config, params);
  throw Error("gate.type: unknown '" + config.gate.type + "' (expected top or cosine_top)");
}

template std::unique_ptr<Gate<float>> make_gate<float>(const MoeConfig&,
                                                       std::vector<std::unique_ptr<Parameter>>&);
template std::unique_ptr<Gate<bf16>> make_gate<bf16>(const MoeConfig&,
                                                     std::vector<std::unique_ptr<Parameter>>&);
template std::unique_ptr<Gate<double>> make_gate<double>(const MoeConfig&,
                                                         std::vector<std::unique_ptr<Parameter>>&);

}  // namespace xmoe::moe
