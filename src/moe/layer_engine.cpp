#include "moe/layer_engine.hpp"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>
#include <numeric>

#include "moe/expert_parallel.hpp"
#include "moe/losses.hpp"
#include "moe/parallel.hpp"
#include "util/random.hpp"
#include "xmoe/error.hpp"

namespace xmoe::moe {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

template <class S>
class LayerEngine final : public LayerEngineBase {
 public:
  using Acc = acc_t<S>;

  LayerEngine(const MoeConfig& c, const kernels::KernelTable& table, Communicator* group,
              std::vector<std::unique_ptr<Parameter>>& params)
      : cfg_(c),
        E_(c.experts.num_experts),
        M_(c.model_dim),
        group_(group && group->size() > 1 ? group : nullptr) {
    ops_.k = &table;
    gate_ = make_gate<S>(c, params);
    if (!group_) {
      experts_ = make_experts<S>(c, whole_model_shard(c), params);
    } else {
      const ExpertPlacement place = place_experts(c, group_->rank(), group_->size());
      const size_t first_param = params.size();
      experts_ = make_experts<S>(c, place.shard, params);
      std::vector<Parameter*> local;
      for (size_t i = first_param; i < params.size(); ++i) local.push_back(params[i].get());
      stage_ = std::make_unique<ExpertParallelStage<S>>(c, *group_, *experts_, local, place);
    }
    O_ = experts_->output_dim();
  }

  int64_t output_dim() const override { return O_; }

  ForwardResult forward(const Tensor& x_in, const Switches& sw, RoutingSummary& summary,
                        PhaseTimes& times) override {
    XMOE_CHECK(x_in.ndim() >= 1 && x_in.dim(x_in.ndim() - 1) == M_,
               "x: last dimension must be model_dim=", M_, ", got shape ", x_in.shape().str());
    const int k = sw.top_k != 0 ? sw.top_k : cfg_.gate.k;
    XMOE_CHECK(k >= 1 && k <= E_, "top_k: must be in [1, num_experts=", E_, "], got ", k);
    const double cf = sw.capacity_factor ? *sw.capacity_factor : cfg_.gate.capacity_factor;
    XMOE_CHECK(std::isfinite(cf), "capacity_factor: must be finite, got ", cf);
    x_ = x_in.dtype() == cfg_.dtype ? x_in : x_in.to(cfg_.dtype);  // Tutel casts x to the experts' dtype
    x_shape_ = x_in.shape();
    const int64_t T = M_ ? x_.numel() / M_ : 0;
    T_ = T, k_ = k;
    const int r = sw.adaptive_r ? *sw.adaptive_r : cfg_.adaptive_r;
    const int overlap = sw.a2a_overlap_degree > 0 ? sw.a2a_overlap_degree : cfg_.a2a_overlap_degree;
    if (stage_)
      stage_->check_r(r);
    else
      XMOE_CHECK(r == 0 || r == 1, "adaptive_r: must be 0 (data parallel) or 1 (expert parallel), got ", r);
    XMOE_CHECK(overlap >= 1 && overlap <= 64, "a2a_overlap_degree: must be in [1, 64], got ", overlap);
    const bool noisy = sw.training && cfg_.gate.gate_noise > 0;
    if (noisy && sw.noise)
      XMOE_CHECK(sw.noise->numel() == T * E_, "noise: expected [", T, ", ", E_, "] draws, got ",
                 sw.noise->shape().str());
    const S* x = x_.template data<S>();
    const auto TE = static_cast<size_t>(T * E_), kT = static_cast<size_t>(k * T);

    // Gate: logits, noise, softmax.
    auto t0 = Clock::now();
    Acc* logits = logits_.ensure(TE);
    gate_->forward(ops_, x, T, logits);
    Acc* noisy_logits = logits;
    if (noisy) {
      noisy_logits = noisy_.ensure(TE);
      const double scale = cfg_.gate.gate_noise / E_;
      const CounterRng rng(cfg_.seed_gate ^ 0x6e6f697365ull, noise_calls_++);
      for (size_t i = 0; i < TE; ++i) {
        const double n = sw.noise ? sw.noise->get(static_cast<int64_t>(i)) : rng.normal(i);
        noisy_logits[i] = static_cast<Acc>(logits[i] + scale * n);
      }
    }
    noisy_used_ = noisy;
    Acc* scores = scores_.ensure(TE);
    parallel_rows(T, 64, [&](int64_t a, int64_t b) {
      ops_.softmax_rows(noisy_logits + a * E_, scores + a * E_, b - a, E_);
    });
    times.gate = seconds_since(t0);

    // Routing: top-k, gate weights, locations, capacity, row plan, aux loss.
    t0 = Clock::now();
    ids_.resize(kT);
    locations_.resize(kT);
    counts_.resize(static_cast<size_t>(E_));
    select_top_k(*ops_.k, scores, T, E_, k, ids_.data());
    Acc* graw = gates_raw_.ensure(kT);
    Acc* g = gates_.ensure(kT);
    Acc* denom = denom_.ensure(static_cast<size_t>(T));
    normalized_ = k > 1 && cfg_.normalize_gate;
    const Acc eps = std::numeric_limits<Acc>::epsilon();
    for (int64_t t = 0; t < T; ++t) {
      Acc sum = 0;
      for (int j = 0; j < k; ++j)
        sum += (graw[j * T + t] = scores[t * E_ + ids_[static_cast<size_t>(j * T + t)]]);
      denom[t] = normalized_ ? std::max(sum, eps) : Acc(1);
      for (int j = 0; j < k; ++j) g[j * T + t] = normalized_ ? graw[j * T + t] / denom[t] : graw[j * T + t];
    }
    const int64_t* order = nullptr;
    if (cfg_.batch_prioritized_routing) {
      order_.resize(static_cast<size_t>(T));
      std::iota(order_.begin(), order_.end(), int64_t{0});
      std::stable_sort(order_.begin(), order_.end(), [&](int64_t a, int64_t b) {
        return scores[a * E_ + ids_[static_cast<size_t>(a)]] > scores[b * E_ + ids_[static_cast<size_t>(b)]];
      });
      order = order_.data();
    }
    compute_locations(ids_.data(), T, E_, k, order, locations_.data(), counts_.data());
    int64_t max_count = T ? *std::max_element(counts_.begin(), counts_.end()) : 0;
    int64_t capacity_tokens = T, alignment = cfg_.capacity_alignment;
    if (group_) {
      // Every rank needs the same C: take the group's largest token count and expert count (so ranks with
      // different, even zero, token counts never disagree; Tutel needs inequivalent_tokens=True for this).
      const int64_t mine[2] = {T, max_count};
      int64_t group_max[2];
      group_->all_reduce(mine, group_max, 2, ElementType::i64, ReduceOp::max);
      capacity_tokens = group_max[0];
      max_count = group_max[1];
      // Tutel aligns capacity to sc·D: every rank of a sharded expert takes an equal share of its slots,
      // every overlap chunk an equal share of them. Grouped execution has no slots to split, so C stays as
      // is.
      if (sw.execution == ExpertExecution::padded)
        alignment = std::lcm(alignment, static_cast<int64_t>(stage_->shards_per_expert()) * overlap);
    }
    capacity_ = compute_capacity(cf, k, capacity_tokens, E_, max_count, alignment);
    plan_rows(ids_.data(), locations_.data(), counts_.data(), T, E_, k, capacity_, sw.execution, plan_);
    double aux;
    if (cfg_.is_gshard_loss) {
      aux = gshard_loss<Acc>(scores, ids_.data(), T, E_, 0.0, nullptr);
    } else {
      Acc* clean = clean_.ensure(TE);
      parallel_rows(T, 64, [&](int64_t a, int64_t b) {
        ops_.softmax_rows(logits + a * E_, clean + a * E_, b - a, E_);
      });
      aux = importance_load_loss<Acc>(clean, noisy_logits, ids_.data() + (k - 1) * T, T, E_,
                                      cfg_.gate.gate_noise, 0.0, nullptr, nullptr);
    }
    times.routing = seconds_since(t0);

    // Encode: each kept copy of token t lands in its row; rows no copy reached stay zero.
    t0 = Clock::now();
    const int64_t R = plan_.total_rows;
    S* disp = dispatched_.ensure(static_cast<size_t>(R * M_));
    zero_unfilled_rows(disp, M_);
    const bool post = cfg_.is_postscore;
    parallel_rows(T, 16, [&](int64_t a, int64_t b) {
      for (int64_t t = a; t < b; ++t)
        for (int j = 0; j < k; ++j) {
          const int64_t row = plan_.row_of[static_cast<size_t>(j * T + t)];
          if (row >= 0) ops_.scale_row(post ? Acc(1) : g[j * T + t], x + t * M_, disp + row * M_, M_);
        }
    });
    times.encode = seconds_since(t0);

    t0 = Clock::now();
    S* yd = expert_out_.ensure(static_cast<size_t>(R * O_));
    if (stage_ && sw.execution == ExpertExecution::grouped)
      stage_->forward_grouped(ops_, disp, plan_.offsets, r, yd);
    else if (stage_)
      stage_->forward(ops_, disp, capacity_, r, overlap, yd);
    else
      experts_->forward(ops_, disp, plan_.offsets, yd);
    times.experts = seconds_since(t0);

    // Decode: y[t] = Σ_j w_j·Y[row_j], w = gate weight when postscore.
    t0 = Clock::now();
    std::array<int64_t, kMaxDims> dims{};
    for (int i = 0; i < x_shape_.ndim(); ++i) dims[static_cast<size_t>(i)] = x_shape_[i];
    dims[static_cast<size_t>(x_shape_.ndim() - 1)] = O_;
    Tensor y = Tensor::empty(
        Shape(std::span<const int64_t>(dims.data(), static_cast<size_t>(x_shape_.ndim()))), cfg_.dtype);
    S* ys = y.template data<S>();
    parallel_rows(T, 16, [&](int64_t a, int64_t b) {
      std::vector<Acc> local;
      Acc* acc_row = nullptr;
      if constexpr (!std::is_same_v<S, Acc>) {
        local.resize(static_cast<size_t>(O_));
        acc_row = local.data();
      }
      for (int64_t t = a; t < b; ++t) {
        Acc* out = nullptr;
        if constexpr (std::is_same_v<S, Acc>)
          out = ys + t * O_;
        else
          out = acc_row;
        std::fill(out, out + O_, Acc(0));
        for (int j = 0; j < k; ++j) {
          const int64_t row = plan_.row_of[static_cast<size_t>(j * T + t)];
          if (row >= 0) ops_.axpy_row(post ? g[j * T + t] : Acc(1), yd + row * O_, out, O_);
        }
        if constexpr (!std::is_same_v<S, Acc>) ops_.to_storage(out, ys + t * O_, O_);
      }
    });
    times.decode = seconds_since(t0);

    summary.tokens = T;
    summary.top_k = k;
    summary.capacity = capacity_;
    summary.expert_counts.assign(counts_.begin(), counts_.end());
    summary.expert_ids.assign(ids_.begin(), ids_.end());
    summary.locations.assign(locations_.begin(), locations_.end());
    summary.dropped = plan_.dropped;
    has_forward_ = true;
    return {std::move(y), aux};
  }

  Tensor backward(const Tensor& dy_in, double daux, PhaseTimes& times) override {
    XMOE_CHECK(has_forward_, "backward: no forward to differentiate");
    const int64_t T = T_;
    const int k = k_;
    XMOE_CHECK(dy_in.numel() == T * O_ && dy_in.ndim() >= 1 && dy_in.dim(dy_in.ndim() - 1) == O_,
               "dy: expected ", T, " rows of output_dim=", O_, ", got shape ", dy_in.shape().str());
    const auto t_start = Clock::now();
    Tensor dy_t = dy_in.dtype() == cfg_.dtype ? dy_in : dy_in.to(cfg_.dtype);
    const S* dy = dy_t.template data<S>();
    const S* x = x_.template data<S>();
    const auto TE = static_cast<size_t>(T * E_), kT = static_cast<size_t>(k * T);
    const int64_t R = plan_.total_rows;
    const bool post = cfg_.is_postscore;
    const Acc* g = gates_.data();
    Acc* dg = dgates_.ensure_zero(kT);

    // Decode backward: dY[row] = w·dy[t]; with postscore, dg = ⟨dy[t], Y[row]⟩.
    const Acc* dy_acc = nullptr;
    if constexpr (std::is_same_v<S, Acc>) {
      dy_acc = dy;
    } else {
      Acc* buf = dy_acc_.ensure(static_cast<size_t>(T * O_));
      ops_.to_acc(dy, buf, T * O_);
      dy_acc = buf;
    }
    S* dyd = dexpert_out_.ensure(static_cast<size_t>(R * O_));
    zero_unfilled_rows(dyd, O_);
    const S* yd = expert_out_.data();
    parallel_rows(T, 16, [&](int64_t a, int64_t b) {
      for (int64_t t = a; t < b; ++t)
        for (int j = 0; j < k; ++j) {
          const int64_t row = plan_.row_of[static_cast<size_t>(j * T + t)];
          if (row < 0) continue;
          ops_.scale_row(post ? g[j * T + t] : Acc(1), dy + t * O_, dyd + row * O_, O_);
          if (post) dg[j * T + t] = ops_.dot_row(yd + row * O_, dy_acc + t * O_, O_);
        }
    });

    auto t0 = Clock::now();
    Acc* dxd = ddispatched_.ensure(static_cast<size_t>(R * M_));
    if (stage_)
      stage_->backward(ops_, dispatched_.data(), dyd, dxd);
    else
      experts_->backward(ops_, dispatched_.data(), dyd, plan_.offsets, {}, dxd);
    times.backward_experts = seconds_since(t0);

    // Encode backward: dx[t] = Σ_j w_j·dX[row_j]; without postscore, dg = ⟨dX[row], x[t]⟩.
    Acc* dx = dx_acc_.ensure(static_cast<size_t>(T * M_));
    parallel_rows(T, 16, [&](int64_t a, int64_t b) {
      for (int64_t t = a; t < b; ++t) {
        std::fill(dx + t * M_, dx + (t + 1) * M_, Acc(0));
        for (int j = 0; j < k; ++j) {
          const int64_t row = plan_.row_of[static_cast<size_t>(j * T + t)];
          if (row < 0) continue;
          ops_.axpy_acc(post ? Acc(1) : g[j * T + t], dxd + row * M_, dx + t * M_, M_);
          if (!post) dg[j * T + t] += ops_.dot_row(x + t * M_, dxd + row * M_, M_);
        }
      }
    });

    // Gate weights → scores (through the normalisation), plus the aux loss.
    Acc* dscores = dscores_.ensure_zero(TE);
    const Acc* graw = gates_raw_.data();
    const Acc* denom = denom_.data();
    const Acc eps = std::numeric_limits<Acc>::epsilon();
    for (int64_t t = 0; t < T; ++t) {
      Acc through_denom = 0;
      if (normalized_) {
        Acc sum = 0;
        for (int j = 0; j < k; ++j) sum += graw[j * T + t];
        if (sum > eps)
          for (int j = 0; j < k; ++j) through_denom += dg[j * T + t] * graw[j * T + t];
        through_denom /= denom[t] * denom[t];
      }
      for (int j = 0; j < k; ++j) {
        const Acc d = normalized_ ? dg[j * T + t] / denom[t] - through_denom : dg[j * T + t];
        dscores[t * E_ + ids_[static_cast<size_t>(j * T + t)]] += d;
      }
    }
    Acc* dnoisy = dnoisy_.ensure_zero(TE);
    Acc* dlogits = dlogits_.ensure_zero(TE);
    const Acc* scores = scores_.data();
    if (cfg_.is_gshard_loss) {
      gshard_loss<Acc>(scores, ids_.data(), T, E_, daux, dscores);
    } else {
      Acc* dclean = dclean_.ensure_zero(TE);
      importance_load_loss<Acc>(clean_.data(), noisy_used_ ? noisy_.data() : logits_.data(),
                                ids_.data() + (k - 1) * T, T, E_, cfg_.gate.gate_noise, daux, dclean, dnoisy);
      softmax_backward(clean_.data(), dclean, dlogits, T);
    }
    softmax_backward(scores, dscores, dnoisy, T);
    for (size_t i = 0; i < TE; ++i) dlogits[i] += dnoisy[i];  // the noise is additive
    gate_->backward(ops_, x, T, dlogits, dx);

    Tensor dx_out = Tensor::empty(x_shape_, cfg_.dtype);
    parallel_rows(T, 64, [&](int64_t a, int64_t b) {
      ops_.to_storage(dx + a * M_, dx_out.template data<S>() + a * M_, (b - a) * M_);
    });
    times.backward = seconds_since(t_start);
    times.communication = stage_ ? stage_->communication_seconds() : 0.0;
    return dx_out;
  }

  size_t workspace_bytes() const override {
    return logits_.bytes() + noisy_.bytes() + scores_.bytes() + clean_.bytes() + gates_raw_.bytes() +
           gates_.bytes() + denom_.bytes() + dispatched_.bytes() + expert_out_.bytes() + dgates_.bytes() +
           dy_acc_.bytes() + dexpert_out_.bytes() + ddispatched_.bytes() + dx_acc_.bytes() +
           dscores_.bytes() + dnoisy_.bytes() + dlogits_.bytes() + dclean_.bytes() +
           gate_->workspace_bytes() + experts_->workspace_bytes() + (stage_ ? stage_->workspace_bytes() : 0) +
           sizeof(int32_t) * (ids_.capacity() + locations_.capacity()) +
           sizeof(int64_t) * (order_.capacity() + plan_.row_of.capacity());
  }

 private:
  // Rows past each expert's filled ones (padding) must read as zero.
  void zero_unfilled_rows(S* buf, int64_t width) {
    for (int64_t e = 0; e < E_; ++e) {
      const auto ue = static_cast<size_t>(e);
      const int64_t begin = plan_.offsets[ue] + plan_.filled[ue], end = plan_.offsets[ue + 1];
      if (end > begin) std::fill(buf + begin * width, buf + end * width, S{});
    }
  }

  // din = p ⊙ (dp − Σ dp·p), added into din.
  void softmax_backward(const Acc* p, const Acc* dp, Acc* din, int64_t T) const {
    parallel_rows(T, 64, [&](int64_t a, int64_t b) {
      for (int64_t t = a; t < b; ++t) {
        Acc s = 0;
        for (int64_t e = 0; e < E_; ++e) s += dp[t * E_ + e] * p[t * E_ + e];
        for (int64_t e = 0; e < E_; ++e) din[t * E_ + e] += p[t * E_ + e] * (dp[t * E_ + e] - s);
      }
    });
  }

  MoeConfig cfg_;
  int E_;
  int64_t M_, O_ = 0;
  Ops<S> ops_;
  std::unique_ptr<Gate<S>> gate_;
  std::unique_ptr<Experts<S>> experts_;
  Communicator* group_;
  std::unique_ptr<ExpertParallelStage<S>> stage_;
  uint64_t noise_calls_ = 0;

  // State of the last forward, kept for backward.
  bool has_forward_ = false, noisy_used_ = false, normalized_ = false;
  Tensor x_;
  Shape x_shape_;
  int64_t T_ = 0, capacity_ = 0;
  int k_ = 0;
  std::vector<int32_t> ids_, locations_, counts_;
  std::vector<int64_t> order_;
  RowPlan plan_;
  Buffer<Acc> logits_, noisy_, scores_, clean_, gates_raw_, gates_, denom_;
  Buffer<S> dispatched_, expert_out_, dexpert_out_;
  Buffer<Acc> dgates_, dy_acc_, ddispatched_, dx_acc_, dscores_, dnoisy_, dlogits_, dclean_;
};

}  // namespace

std::unique_ptr<LayerEngineBase> make_layer_engine(const MoeConfig& c, const kernels::KernelTable& table,
                                                   Communicator* group,
                                                   std::vector<std::unique_ptr<Parameter>>& params) {
  switch (c.dtype) {
    case DType::f32:
      return std::make_unique<LayerEngine<float>>(c, table, group, params);
    case DType::bf16:
      return std::make_unique<LayerEngine<bf16>>(c, table, group, params);
    case DType::f64:
      return std::make_unique<LayerEngine<double>>(c, table, group, params);
  }
  throw Error("dtype: unsupported");
}

}  // namespace xmoe::moe
