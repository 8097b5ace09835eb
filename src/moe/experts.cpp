#include "moe/experts.hpp"

#include <cmath>

#include "moe/parallel.hpp"
#include "util/buffer.hpp"
#include "util/random.hpp"
#include "xmoe/error.hpp"

namespace xmoe::moe {

using kernels::Activation;

Activation parse_activation(const std::string& name) {
  if (name == "relu") return Activation::relu;
  if (name == "gelu") return Activation::gelu;
  if (name == "silu" || name == "swish") return Activation::silu;
  if (name == "identity" || name == "none") return Activation::identity;
  throw Error("experts.activation: unknown '" + name + "' (expected relu, gelu, silu or identity)");
}

namespace {

Parameter& add_expert_param(std::vector<std::unique_ptr<Parameter>>& params, const std::string& name,
                            const Shape& shape, DType dtype, bool with_grad = true) {
  auto p = std::make_unique<Parameter>();
  p->name = name;
  p->value = Tensor::zeros(shape, dtype);
  if (with_grad) p->grad = Tensor::zeros(shape, dtype == DType::f64 ? DType::f64 : DType::f32);
  p->is_expert = true;
  params.push_back(std::move(p));
  return *params.back();
}

// Where element i of a local [count, rows, cols] expert tensor sits in the whole model's [E, full_rows, cols]
// tensor, the local rows being [row_begin, row_begin + rows) of each expert's full_rows.
struct ShardIndex {
  int64_t first, rows, cols, full_rows, row_begin;
  uint64_t operator()(int64_t i) const {
    const int64_t per = rows * cols, l = i / per, r = (i % per) / cols, c = i % cols;
    return static_cast<uint64_t>(((first + l) * full_rows + row_begin + r) * cols + c);
  }
};

void init_uniform(Tensor& t, double bound, uint64_t seed, uint64_t stream, const ShardIndex& at) {
  CounterRng rng(seed, stream);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, (2.0 * rng.uniform(at(i)) - 1.0) * bound);
}

void init_normal(Tensor& t, double stddev, uint64_t seed, uint64_t stream, const ShardIndex& at) {
  CounterRng rng(seed, stream);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, stddev * rng.normal(at(i)));
}

template <class S>
acc_t<S> to_acc_value(S v) {
  if constexpr (std::is_same_v<S, bf16>)
    return static_cast<float>(v);
  else
    return v;
}

// An Acc-typed buffer that aliases S storage when the types agree, so f32/f64 skip conversions.
template <class S>
struct StagedRows {
  using Acc = acc_t<S>;
  Buffer<Acc> acc;
  Buffer<S> store;
  Acc* acc_for(S* dst, size_t n) {
    if constexpr (std::is_same_v<S, Acc>)
      return dst;
    else
      return acc.ensure(n);
  }
  size_t bytes() const { return acc.bytes() + store.bytes(); }
};

// Tutel's FusedExpertsNetwork: y = act(x W1ᵀ + b1) W2 + b2, W1 [E, H, M], W2 [E, H, O].
template <class S>
class FfnExperts final : public Experts<S> {
 public:
  using Acc = acc_t<S>;
  FfnExperts(const MoeConfig& c, const ExpertShard& sh, std::vector<std::unique_ptr<Parameter>>& params)
      : E_(sh.count),
        M_(c.model_dim),
        H_(sh.hidden_size),
        O_(c.experts.output_dim > 0 ? c.experts.output_dim : c.model_dim),
        act_(parse_activation(c.experts.activation)) {
    w1_ = &add_expert_param(params, "experts.batched_fc1_w", {E_, H_, M_}, c.dtype);
    w2_ = &add_expert_param(params, "experts.batched_fc2_w", {E_, H_, O_}, c.dtype);
    if (c.experts.has_fc1_bias)
      b1_ = &add_expert_param(params, "experts.batched_fc1_bias", {E_, H_}, c.dtype);
    if (c.experts.has_fc2_bias)
      b2_ = &add_expert_param(params, "experts.batched_fc2_bias",
                              {E_, sh.output_size > 0 ? sh.output_size : O_}, c.dtype);
    const int64_t full_h = c.experts.hidden_size;
    init_uniform(w1_->value, 1.0 / std::sqrt(static_cast<double>(M_)), c.seed_experts, 0,
                 ShardIndex{sh.first, H_, M_, full_h, sh.hidden_begin});
    init_uniform(w2_->value, 1.0 / std::sqrt(static_cast<double>(full_h)), c.seed_experts, 1,
                 ShardIndex{sh.first, H_, O_, full_h, sh.hidden_begin});
  }
  int64_t output_dim() const override { return O_; }

  void forward_rows(const Ops<S>& ops, const S* x, std::span<const ExpertRange> ranges, int64_t R,
                    S* y) override {
    XMOE_CHECK(
        !b2_ || b2_->value.dim(1) == O_,
        "experts: this object holds a slice of the fc2 bias (a hidden-sharded expert's parameters) and "
        "cannot run forward");
    Acc* pre = pre_.ensure(static_cast<size_t>(R * H_));
    S* a = act_out_.ensure(static_cast<size_t>(R * H_));
    Acc* a_acc = act_stage_.acc_for(a, static_cast<size_t>(R * H_));
    Acc* y_acc = out_stage_.acc_for(y, static_cast<size_t>(R * O_));
    const Acc* b1 = bias_acc(ops, b1_, H_, b1_acc_);
    const Acc* b2 = bias_acc(ops, b2_, O_, b2_acc_);
    for (const ExpertRange& rg : ranges) {
      const int64_t e = rg.expert, r0 = rg.begin, r = rg.end - rg.begin;
      XMOE_CHECK(e >= 0 && e < E_ && r0 >= 0 && r >= 0 && rg.end <= R, "experts: bad row range");
      if (r == 0) continue;
      ops.gemm(gemm_args<S, Acc>(r, H_, M_, x + r0 * M_, M_, false, w1_->value.data<S>() + e * H_ * M_, M_,
                                 true, pre + r0 * H_, H_, false));
      parallel_rows(r, 16, [&](int64_t i0, int64_t i1) {
        Acc* p = pre + (r0 + i0) * H_;
        ops.bias_act(Activation::identity, p, b1 ? b1 + e * H_ : nullptr, p, i1 - i0, H_);
        ops.bias_act(act_, p, nullptr, a_acc + (r0 + i0) * H_, i1 - i0, H_);
        if constexpr (!std::is_same_v<S, Acc>)
          ops.to_storage(a_acc + (r0 + i0) * H_, a + (r0 + i0) * H_, (i1 - i0) * H_);
      });
      ops.gemm(gemm_args<S, Acc>(r, O_, H_, a + r0 * H_, H_, false, w2_->value.data<S>() + e * H_ * O_, O_,
                                 false, y_acc + r0 * O_, O_, false));
      parallel_rows(r, 16, [&](int64_t i0, int64_t i1) {
        Acc* q = y_acc + (r0 + i0) * O_;
        if (b2) ops.bias_act(Activation::identity, q, b2 + e * O_, q, i1 - i0, O_);
        if constexpr (!std::is_same_v<S, Acc>) ops.to_storage(q, y + (r0 + i0) * O_, (i1 - i0) * O_);
      });
    }
  }

  bool supports_split_backward() const override { return true; }

  // dh = act'(pre) ⊙ dy W2ᵀ (kept for backward_params), dx = dh W1.
  void backward_rows(const Ops<S>& ops, const S*, const S* dy, std::span<const ExpertRange> ranges, int64_t R,
                     Acc* dx) override {
    Acc* dh = dh_.ensure(static_cast<size_t>(R * H_));
    S* dh_s = dh_stage_.store.ensure(static_cast<size_t>(R * H_));
    const Acc* pre = pre_.data();
    for (const ExpertRange& rg : ranges) {
      const int64_t e = rg.expert, r0 = rg.begin, r = rg.end - rg.begin;
      XMOE_CHECK(e >= 0 && e < E_ && r0 >= 0 && r >= 0 && rg.end <= R, "experts: bad row range");
      if (r == 0) continue;
      ops.gemm(gemm_args<S, Acc>(r, H_, O_, dy + r0 * O_, O_, false, w2_->value.data<S>() + e * H_ * O_, O_,
                                 true, dh + r0 * H_, H_, false));
      parallel_rows(r, 16, [&](int64_t i0, int64_t i1) {
        Acc* d = dh + (r0 + i0) * H_;
        ops.act_backward(act_, pre + (r0 + i0) * H_, d, d, (i1 - i0) * H_);
        if constexpr (!std::is_same_v<S, Acc>) ops.to_storage(d, dh_s + (r0 + i0) * H_, (i1 - i0) * H_);
      });
      const S* dhs = std::is_same_v<S, Acc> ? reinterpret_cast<const S*>(dh) : dh_s;
      ops.gemm(gemm_args<S, Acc>(r, M_, H_, dhs + r0 * H_, H_, false, w1_->value.data<S>() + e * H_ * M_, M_,
                                 false, dx + r0 * M_, M_, false));
    }
  }

  void backward_params(const Ops<S>& ops, const S* x, const S* dy, std::span<const int64_t> off,
                       std::span<const int64_t> cuts) override {
    const Acc* dh = dh_.data();
    const S* a = act_out_.data();
    const S* dhs = std::is_same_v<S, Acc> ? reinterpret_cast<const S*>(dh) : dh_stage_.store.data();
    for_each_segment(off, cuts, [&](int64_t e, int64_t r0, int64_t r1) {
      const int64_t r = r1 - r0;
      const S* dy_e = dy + r0 * O_;
      if (b2_) column_sums(dy_e, r, O_, b2_->grad.data<Acc>() + e * O_, to_acc_value<S>);
      ops.gemm(gemm_args<S, Acc>(H_, O_, r, a + r0 * H_, H_, true, dy_e, O_, false,
                                 w2_->grad.data<Acc>() + e * H_ * O_, O_, true));
      if (b1_) column_sums(dh + r0 * H_, r, H_, b1_->grad.data<Acc>() + e * H_, [](Acc v) { return v; });
      ops.gemm(gemm_args<S, Acc>(H_, M_, r, dhs + r0 * H_, H_, true, x + r0 * M_, M_, false,
                                 w1_->grad.data<Acc>() + e * H_ * M_, M_, true));
    });
  }

  size_t workspace_bytes() const override {
    return pre_.bytes() + act_out_.bytes() + act_stage_.bytes() + out_stage_.bytes() + dh_.bytes() +
           dh_stage_.bytes() + b1_acc_.bytes() + b2_acc_.bytes();
  }

 private:
  static const Acc* bias_acc(const Ops<S>& ops, Parameter* b, int64_t n, Buffer<Acc>& buf) {
    if (!b) return nullptr;
    if constexpr (std::is_same_v<S, Acc>) {
      (void)ops, (void)n, (void)buf;
      return b->value.data<S>();
    } else {
      Acc* out = buf.ensure(static_cast<size_t>(b->value.numel()));
      ops.to_acc(b->value.data<S>(), out, b->value.numel());
      return out;
    }
  }

  int64_t E_, M_, H_, O_;
  Activation act_;
  Parameter *w1_ = nullptr, *w2_ = nullptr, *b1_ = nullptr, *b2_ = nullptr;
  Buffer<Acc> pre_, dh_, b1_acc_, b2_acc_;
  Buffer<S> act_out_;
  StagedRows<S> act_stage_, out_stage_, dh_stage_;
};

// SwiGLU experts in Hugging Face layout: y = (silu(x Gᵀ) ⊙ x Uᵀ) Dᵀ, G/U [E, H, M], D [E, M, H], no biases.
template <class S>
class SwigluExperts final : public Experts<S> {
 public:
  using Acc = acc_t<S>;
  SwigluExperts(const MoeConfig& c, const ExpertShard& sh, std::vector<std::unique_ptr<Parameter>>& params)
      : E_(sh.count), M_(c.model_dim), H_(sh.hidden_size) {
    gate_ = &add_expert_param(params, "experts.gate_proj", {E_, H_, M_}, c.dtype, !sh.inference_only);
    up_ = &add_expert_param(params, "experts.up_proj", {E_, H_, M_}, c.dtype, !sh.inference_only);
    down_ = &add_expert_param(params, "experts.down_proj", {E_, M_, H_}, c.dtype, !sh.inference_only);
    if (sh.inference_only) return;
    const int64_t full_h = c.experts.hidden_size;
    init_normal(gate_->value, 0.01, c.seed_experts, 0, ShardIndex{sh.first, H_, M_, full_h, sh.hidden_begin});
    init_normal(up_->value, 0.01, c.seed_experts, 1, ShardIndex{sh.first, H_, M_, full_h, sh.hidden_begin});
    // down_proj [E, M, H]: the shard is a column block, so map (row m, column h) separately.
    CounterRng down_rng(c.seed_experts, 2);
    for (int64_t i = 0; i < down_->value.numel(); ++i) {
      const int64_t l = i / (M_ * H_), m = (i / H_) % M_, h = i % H_;
      const auto g = static_cast<uint64_t>(((sh.first + l) * M_ + m) * full_h + sh.hidden_begin + h);
      down_->value.set(i, 0.01 * down_rng.normal(g));
    }
  }
  int64_t output_dim() const override { return M_; }

  void forward_rows(const Ops<S>& ops, const S* x, std::span<const ExpertRange> ranges, int64_t R,
                    S* y) override {
    Acc* g = g_.ensure(static_cast<size_t>(R * H_));
    Acc* u = u_.ensure(static_cast<size_t>(R * H_));
    S* a = a_.ensure(static_cast<size_t>(R * H_));
    Acc* a_acc = a_stage_.acc_for(a, static_cast<size_t>(R * H_));
    Acc* y_acc = y_stage_.acc_for(y, static_cast<size_t>(R * M_));
    for (const ExpertRange& rg : ranges) {
      const int64_t e = rg.expert, r0 = rg.begin, r = rg.end - rg.begin;
      XMOE_CHECK(e >= 0 && e < E_ && r0 >= 0 && r >= 0 && rg.end <= R, "experts: bad row range");
      if (r == 0) continue;
      const S* xe = x + r0 * M_;
      ops.gemm(gemm_args<S, Acc>(r, H_, M_, xe, M_, false, gate_->value.data<S>() + e * H_ * M_, M_, true,
                                 g + r0 * H_, H_, false));
      ops.gemm(gemm_args<S, Acc>(r, H_, M_, xe, M_, false, up_->value.data<S>() + e * H_ * M_, M_, true,
                                 u + r0 * H_, H_, false));
      parallel_rows(r, 16, [&](int64_t i0, int64_t i1) {
        const int64_t o = (r0 + i0) * H_, n = (i1 - i0) * H_;
        ops.silu_mul(g + o, u + o, a_acc + o, n);
        if constexpr (!std::is_same_v<S, Acc>) ops.to_storage(a_acc + o, a + o, n);
      });
      ops.gemm(gemm_args<S, Acc>(r, M_, H_, a + r0 * H_, H_, false, down_->value.data<S>() + e * M_ * H_, H_,
                                 true, y_acc + r0 * M_, M_, false));
      if constexpr (!std::is_same_v<S, Acc>) {
        parallel_rows(r, 16, [&](int64_t i0, int64_t i1) {
          ops.to_storage(y_acc + (r0 + i0) * M_, y + (r0 + i0) * M_, (i1 - i0) * M_);
        });
      }
    }
  }

  bool supports_split_backward() const override { return true; }

  // dg, du through silu_mul (kept for backward_params), dx = dg G + du U.
  void backward_rows(const Ops<S>& ops, const S*, const S* dy, std::span<const ExpertRange> ranges, int64_t R,
                     Acc* dx) override {
    Acc* da = da_.ensure(static_cast<size_t>(R * H_));
    Acc* dg = dg_.ensure(static_cast<size_t>(R * H_));
    Acc* du = du_.ensure(static_cast<size_t>(R * H_));
    S* dg_s = dg_stage_.store.ensure(static_cast<size_t>(R * H_));
    S* du_s = du_stage_.store.ensure(static_cast<size_t>(R * H_));
    for (const ExpertRange& rg : ranges) {
      const int64_t e = rg.expert, r0 = rg.begin, r = rg.end - rg.begin;
      XMOE_CHECK(e >= 0 && e < E_ && r0 >= 0 && r >= 0 && rg.end <= R, "experts: bad row range");
      if (r == 0) continue;
      ops.gemm(gemm_args<S, Acc>(r, H_, M_, dy + r0 * M_, M_, false, down_->value.data<S>() + e * M_ * H_, H_,
                                 false, da + r0 * H_, H_, false));
      parallel_rows(r, 16, [&](int64_t i0, int64_t i1) {
        const int64_t o = (r0 + i0) * H_, n = (i1 - i0) * H_;
        ops.silu_mul_backward(g_.data() + o, u_.data() + o, da + o, dg + o, du + o, n);
        if constexpr (!std::is_same_v<S, Acc>) {
          ops.to_storage(dg + o, dg_s + o, n);
          ops.to_storage(du + o, du_s + o, n);
        }
      });
      const S* dgs = std::is_same_v<S, Acc> ? reinterpret_cast<const S*>(dg) : dg_s;
      const S* dus = std::is_same_v<S, Acc> ? reinterpret_cast<const S*>(du) : du_s;
      ops.gemm(gemm_args<S, Acc>(r, M_, H_, dgs + r0 * H_, H_, false, gate_->value.data<S>() + e * H_ * M_,
                                 M_, false, dx + r0 * M_, M_, false));
      ops.gemm(gemm_args<S, Acc>(r, M_, H_, dus + r0 * H_, H_, false, up_->value.data<S>() + e * H_ * M_, M_,
                                 false, dx + r0 * M_, M_, true));
    }
  }

  void backward_params(const Ops<S>& ops, const S* x, const S* dy, std::span<const int64_t> off,
                       std::span<const int64_t> cuts) override {
    const S* dgs = std::is_same_v<S, Acc> ? reinterpret_cast<const S*>(dg_.data()) : dg_stage_.store.data();
    const S* dus = std::is_same_v<S, Acc> ? reinterpret_cast<const S*>(du_.data()) : du_stage_.store.data();
    for_each_segment(off, cuts, [&](int64_t e, int64_t r0, int64_t r1) {
      const int64_t r = r1 - r0;
      const S* xe = x + r0 * M_;
      ops.gemm(gemm_args<S, Acc>(M_, H_, r, dy + r0 * M_, M_, true, a_.data() + r0 * H_, H_, false,
                                 down_->grad.data<Acc>() + e * M_ * H_, H_, true));
      ops.gemm(gemm_args<S, Acc>(H_, M_, r, dgs + r0 * H_, H_, true, xe, M_, false,
                                 gate_->grad.data<Acc>() + e * H_ * M_, M_, true));
      ops.gemm(gemm_args<S, Acc>(H_, M_, r, dus + r0 * H_, H_, true, xe, M_, false,
                                 up_->grad.data<Acc>() + e * H_ * M_, M_, true));
    });
  }

  size_t workspace_bytes() const override {
    return g_.bytes() + u_.bytes() + a_.bytes() + a_stage_.bytes() + y_stage_.bytes() + da_.bytes() +
           dg_.bytes() + du_.bytes() + dg_stage_.bytes() + du_stage_.bytes();
  }

 private:
  int64_t E_, M_, H_;
  Parameter *gate_, *up_, *down_;
  Buffer<Acc> g_, u_, da_, dg_, du_;
  Buffer<S> a_;
  StagedRows<S> a_stage_, y_stage_, dg_stage_, du_stage_;
};

// A user's CustomExpert behind the same interface; its tensors are views of the layer's buffers.
template <class S>
class CustomExperts final : public Experts<S> {
 public:
  using Acc = acc_t<S>;
  CustomExperts(const MoeConfig& c, std::vector<std::unique_ptr<Parameter>>& params)
      : custom_(c.experts.custom), M_(c.model_dim), O_(custom_->output_dim(c.model_dim)), dtype_(c.dtype) {
    XMOE_CHECK(O_ > 0, "experts.custom: output_dim() must be positive, got ", O_);
    for (Parameter* p : custom_->parameters()) {
      XMOE_CHECK(p != nullptr, "experts.custom: parameters() returned a null parameter");
      auto copy = std::make_unique<Parameter>(*p);  // shares storage with the custom expert's tensors
      copy->is_expert = true;
      params.push_back(std::move(copy));
    }
  }
  int64_t output_dim() const override { return O_; }
  bool supports_row_ranges() const override { return false; }
  void forward_rows(const Ops<S>&, const S* x, std::span<const ExpertRange> ranges, int64_t R,
                    S* y) override {
    // A CustomExpert sees one range per expert, in order, covering the buffer.
    offsets_.assign(1, 0);
    for (size_t i = 0; i < ranges.size(); ++i) {
      XMOE_CHECK(ranges[i].expert == static_cast<int64_t>(i) && ranges[i].begin == offsets_.back(),
                 "experts.custom: row ranges must be one per expert, in order");
      offsets_.push_back(ranges[i].end);
    }
    XMOE_CHECK(offsets_.back() == R, "experts.custom: row ranges must cover the buffer");
    const std::span<const int64_t> off = offsets_;
    Tensor xt = Tensor::wrap(const_cast<S*>(x), {R, M_}, dtype_, nullptr);
    Tensor yt = Tensor::wrap(y, {R, O_}, dtype_, nullptr);
    custom_->forward(xt, off, yt);
    XMOE_CHECK(yt.raw() == y && yt.dim(0) == R && yt.dim(1) == O_,
               "experts.custom: forward must write into the given y [", R, ", ", O_, "]");
  }
  // (A user's backward sees each expert's rows whole: `cuts` is not its business.)
  void backward(const Ops<S>& ops, const S*, const S* dy, std::span<const int64_t> off,
                std::span<const int64_t>, Acc* dx) override {
    const int64_t R = off.back();
    S* dxs = dx_store_.ensure(static_cast<size_t>(R * M_));
    Tensor dyt = Tensor::wrap(const_cast<S*>(dy), {R, O_}, dtype_, nullptr);
    Tensor dxt = Tensor::wrap(dxs, {R, M_}, dtype_, nullptr);
    custom_->backward(dyt, off, dxt);
    ops.to_acc(dxs, dx, R * M_);
  }
  size_t workspace_bytes() const override { return dx_store_.bytes(); }

 private:
  std::shared_ptr<CustomExpert> custom_;
  int64_t M_, O_;
  DType dtype_;
  Buffer<S> dx_store_;
  std::vector<int64_t> offsets_;
};

}  // namespace

ExpertShard whole_model_shard(const MoeConfig& c) {
  return ExpertShard{0, c.experts.num_experts, 0, c.experts.hidden_size, 0, 0};
}

int expert_split_dim(const std::string& name) {
  if (name == "experts.batched_fc1_w" || name == "experts.batched_fc2_w" ||
      name == "experts.batched_fc1_bias" || name == "experts.batched_fc2_bias" ||
      name == "experts.gate_proj" || name == "experts.up_proj")
    return 1;
  if (name == "experts.down_proj") return 2;
  throw Error("experts: parameter '" + name + "' is not a built-in expert parameter that can be sharded");
}

template <class S>
std::unique_ptr<Experts<S>> make_experts(const MoeConfig& c, const ExpertShard& shard,
                                         std::vector<std::unique_ptr<Parameter>>& params) {
  const std::string& type = c.experts.type;
  if (type == "ffn") return std::make_unique<FfnExperts<S>>(c, shard, params);
  if (type == "swiglu") return std::make_unique<SwigluExperts<S>>(c, shard, params);
  if (type == "custom") {
    XMOE_CHECK(c.experts.custom != nullptr, "experts.custom: type 'custom' needs an expert object");
    return std::make_unique<CustomExperts<S>>(c, params);
  }
  throw Error("experts.type: unknown '" + type + "' (expected ffn, swiglu or custom)");
}

#define XMOE_INSTANTIATE(S)                                                                  \
  template std::unique_ptr<Experts<S>> make_experts<S>(const MoeConfig&, const ExpertShard&, \
                                                       std::vector<std::unique_ptr<Parameter>>&);
XMOE_INSTANTIATE(float)
XMOE_INSTANTIATE(bf16)
XMOE_INSTANTIATE(double)
#undef XMOE_INSTANTIATE

}  // namespace xmoe::moe
