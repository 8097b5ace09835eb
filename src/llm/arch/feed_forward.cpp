#include "llm/arch/feed_forward.hpp"

#include <algorithm>
#include <optional>

#include "kernels/linear.hpp"
#include "llm/layers/linear_parts.hpp"
#include "llm/layers/quantized_views.hpp"
#include "moe/parallel.hpp"
#include "moe/routed_experts.hpp"
#include "util/buffer.hpp"
#include "xmoe/error.hpp"

namespace xmoe::llm {

namespace {

using kernels::PackedWeight;

// Router products up to this many multiply-adds run on the calling thread (Qwen3-30B-A3B's up to 16 rows,
// batched decode). At 8-16 rows (2-4 M multiply-adds, ~0.1 ms on one core) a team would save at most half of
// that on an idle machine, and its wake-up costs far more on a loaded one (batch 16 at load 6: the router
// took 6.1 ms of wall time per 8-layer step for 1.2 ms of CPU time).
constexpr double kRouterAloneMacs = 1 << 22;

class DenseSwiglu final : public FeedForward {
 public:
  DenseSwiglu(const kernels::KernelTable& table, PackedWeight gate, PackedWeight up, PackedWeight down)
      : table_(&table), down_(down) {
    // gate and up read the same input: one view when the checkpoint holds them back to back.
    parts_ = {gate, up};
    if (auto joined = kernels::join_rows(parts_)) parts_ = {*joined};
  }
  uint64_t forward(const float* x, int64_t T, float* y, moe::ExpertScratch& scratch) override {
    const int64_t I = down_.cols;
    ProfileScope scope(
        profile_, ProfileOp::experts, static_cast<double>(fixed_bytes()),
        6.0 * static_cast<double>(T) * static_cast<double>(I) * static_cast<double>(down_.rows));
    float* gu = scratch.gate_up.ensure(static_cast<size_t>(T * 2 * I));
    float* act = scratch.act.ensure(static_cast<size_t>(T * I));
    linear_forward_parts(*table_, parts_, x, T, down_.rows, gu, 2 * I);
    moe::parallel_rows(T, 16, [&](int64_t a, int64_t b) {
      for (int64_t t = a; t < b; ++t)
        table_->silu_mul_f32(gu + t * 2 * I, gu + t * 2 * I + I, act + t * I, I);
    });
    kernels::linear_forward(*table_, down_, act, T, y);
    return 0;
  }
  size_t fixed_bytes() const override {
    size_t n = down_.bytes();
    for (const PackedWeight& w : parts_) n += w.bytes();
    return n;
  }
  size_t per_token_bytes() const override { return 0; }
  void set_profile(StepProfile* profile) override { profile_ = profile; }

 private:
  const kernels::KernelTable* table_;
  StepProfile* profile_ = nullptr;
  std::vector<PackedWeight> parts_;
  PackedWeight down_;
};

class SwigluMoe final : public FeedForward {
 public:
  SwigluMoe(const kernels::KernelTable& table, PackedWeight router, std::vector<float> router_bias,
            std::vector<float> correction_bias, const LlmRouterConfig& config,
            std::vector<moe::SwigluWeights> experts, std::unique_ptr<DenseSwiglu> shared)
      : table_(&table),
        router_(router),
        router_bias_(std::move(router_bias)),
        correction_bias_(std::move(correction_bias)),
        config_(config),
        experts_(std::move(experts), table),
        shared_(std::move(shared)) {}

  uint64_t forward(const float* x, int64_t T, float* y, moe::ExpertScratch& scratch) override {
    const int E = config_.num_experts, k = config_.top_k;
    std::optional<ProfileScope> scope;
    if (profile_)
      scope.emplace(
          profile_, ProfileOp::router, static_cast<double>(router_.bytes()),
          2.0 * static_cast<double>(T) * static_cast<double>(E) * static_cast<double>(router_.cols));
    float* logits = logits_.ensure(static_cast<size_t>(T * E));
    // A decode-sized router (128 × 2048 BF16 is 0.5 MB) streams on one core in about the time a team takes
    // to wake, and measured faster alone on a loaded machine (8 layers: 0.25 vs 0.38 ms per step). Any
    // column split gives the same bits.
    if (static_cast<double>(T) * static_cast<double>(E) * static_cast<double>(router_.cols) <=
        kRouterAloneMacs)
      kernels::linear_forward_columns(*table_, router_, x, T, router_.cols, 0, router_.rows, logits, E);
    else
      kernels::linear_forward(*table_, router_, x, T, logits);
    if (!router_bias_.empty())
      for (int64_t t = 0; t < T; ++t)
        for (int e = 0; e < E; ++e) logits[t * E + e] += router_bias_[static_cast<size_t>(e)];
    ids_.resize(static_cast<size_t>(T * k));
    weights_.resize(static_cast<size_t>(T * k));
    llm_route(config_, logits, correction_bias_.empty() ? nullptr : correction_bias_.data(), T, ids_.data(),
              weights_.data());
    chosen_.assign(static_cast<size_t>(E), 0);
    for (int32_t id : ids_) chosen_[static_cast<size_t>(id)] = 1;
    const auto n = static_cast<uint64_t>(std::count(chosen_.begin(), chosen_.end(), 1));
    if (profile_) {
      // gate, up and down: 3 · 2 · I · H flops per token and expert.
      const double I = static_cast<double>(experts_.experts().expert(0).down.cols);
      scope.emplace(profile_, ProfileOp::experts, static_cast<double>(n * expert_bytes()),
                    6.0 * static_cast<double>(T) * k * I * static_cast<double>(router_.cols));
    }
    experts_.forward(x, T, k, ids_.data(), weights_.data(), y, scratch);
    if (shared_) {
      const int64_t H = router_.cols;
      float* s = scratch.shared_out.ensure(static_cast<size_t>(T * H));
      shared_->forward(x, T, s, scratch);  // the routed experts' output is in y by now
      moe::parallel_rows(T, 16, [&](int64_t a, int64_t b) {
        for (int64_t i = a * H; i < b * H; ++i) y[i] += s[i];
      });
    }
    return n * expert_bytes();
  }
  // The shared experts are read by every step, like the router.
  size_t fixed_bytes() const override {
    return router_.bytes() + (router_bias_.size() + correction_bias_.size()) * sizeof(float) +
           (shared_ ? shared_->fixed_bytes() : 0);
  }
  size_t per_token_bytes() const override { return static_cast<size_t>(config_.top_k) * expert_bytes(); }
  void set_profile(StepProfile* profile) override {
    profile_ = profile;
    if (shared_) shared_->set_profile(profile);
  }

 private:
  size_t expert_bytes() const { return experts_.experts().expert(0).bytes(); }
  const kernels::KernelTable* table_;
  PackedWeight router_;
  std::vector<float> router_bias_;
  std::vector<float> correction_bias_;  // selection only; empty = none
  LlmRouterConfig config_;
  moe::RoutedExperts experts_;
  std::unique_ptr<DenseSwiglu> shared_;  // null = no shared experts
  StepProfile* profile_ = nullptr;
  Buffer<float> logits_;
  std::vector<int32_t> ids_;
  std::vector<float> weights_;
  std::vector<char> chosen_;  // by expert, in the step being run
};

std::unique_ptr<DenseSwiglu> load_dense(DecoderLoader& loader, const DenseMlpNames& names, int64_t hidden,
                                        int64_t intermediate) {
  XMOE_CHECK(intermediate > 0, loader.checkpoint().dir(), "/config.json: intermediate_size must be > 0 for ",
             names.gate);
  PackedWeight gate = loader.matrix(names.gate, intermediate, hidden);
  PackedWeight up = loader.matrix(names.up, intermediate, hidden);
  PackedWeight down = loader.matrix(names.down, hidden, intermediate);
  return std::make_unique<DenseSwiglu>(loader.table(), gate, up, down);
}

}  // namespace

std::unique_ptr<FeedForward> load_dense_swiglu(DecoderLoader& loader, const DenseMlpNames& names,
                                               int64_t hidden, int64_t intermediate) {
  return load_dense(loader, names, hidden, intermediate);
}

std::unique_ptr<FeedForward> load_swiglu_moe(DecoderLoader& loader, const MoeNames& names,
                                             const LlmRouterConfig& router, int64_t hidden,
                                             int64_t intermediate, int layer) {
  const Checkpoint& ckpt = loader.checkpoint();
  const int E = router.num_experts;
  const int64_t H = hidden, I = intermediate;
  XMOE_CHECK(I > 0 && router.top_k >= 1 && router.top_k <= E, ckpt.dir(), "/config.json: ",
             "MoE layers need moe_intermediate_size > 0 and 1 <= num_experts_per_tok <= num_experts");
  validate(router);
  PackedWeight gate = loader.matrix(names.router, E, H);
  std::vector<float> bias, correction_bias;
  if (!names.router_bias.empty()) bias = loader.vector(names.router_bias, E);
  if (!names.correction_bias.empty()) {
    XMOE_CHECK(router.type == LlmRouterType::deepseek_v3 || router.type == LlmRouterType::kimi_k2,
               "checkpoint ", ckpt.dir(), ": layer ", layer, ": ", names.correction_bias,
               " needs a sigmoid router (deepseek_v3 or kimi_k2)");
    correction_bias = loader.vector(names.correction_bias, E);
  }
  // The experts as views: per-expert tensors, or slices of the fused gate_up [E, 2I, H] (gate rows first,
  // then up rows) and down [E, H, I].
  std::vector<moe::SwigluWeights> experts(static_cast<size_t>(E));
  if (!names.fused_gate_up.empty() && holds_linear(ckpt, names.fused_gate_up)) {
    const std::vector<PackedWeight> gate_up = loader.weights().stacked(names.fused_gate_up, E, 2 * I, H);
    const std::vector<PackedWeight> downs = loader.weights().stacked(names.fused_down, E, H, I);
    for (size_t e = 0; e < experts.size(); ++e) {
      experts[e].gate = kernels::slice_rows(gate_up[e], 0, I);
      experts[e].up = kernels::slice_rows(gate_up[e], I, I);
      experts[e].down = downs[e];
    }
    loader.report();
  } else {
    for (int e = 0; e < E; ++e) {
      moe::SwigluWeights& w = experts[static_cast<size_t>(e)];
      w.gate = loader.matrix(names.expert(e, "gate_proj"), I, H);
      w.up = loader.matrix(names.expert(e, "up_proj"), I, H);
      w.down = loader.matrix(names.expert(e, "down_proj"), H, I);
    }
  }
  for (int e = 0; e < E; ++e) {
    const moe::SwigluWeights& w = experts[static_cast<size_t>(e)];
    XMOE_CHECK(w.gate.global_scale == w.up.global_scale, "checkpoint ", ckpt.dir(), ": layer ", layer,
               " expert ", e, ": gate_proj and up_proj have different global scales (", w.gate.global_scale,
               " and ", w.up.global_scale,
               "); NVFP4 requires one shared weight_scale_2 / weight_global_scale");
  }
  std::unique_ptr<DenseSwiglu> shared;
  if (names.shared_intermediate > 0) shared = load_dense(loader, names.shared, H, names.shared_intermediate);
  return std::make_unique<SwigluMoe>(loader.table(), gate, std::move(bias), std::move(correction_bias),
                                     router, std::move(experts), std::move(shared));
}

}  // namespace xmoe::llm
