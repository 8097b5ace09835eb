// The router stage of an LLM's MoE block: logits = x · Wᵀ (+ bias) through the kernel table's linear kernel
// for W's format, then one of xmoe::llm_route's routers (Qwen3's softmax-then-top-k, gpt-oss's top-k on the
// logits then a softmax over the chosen k, DeepSeek's sigmoid with a correction bias, …).
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/kernels.hpp"
#include "util/buffer.hpp"
#include "xmoe/llm_routing.hpp"

namespace xmoe::moe {

class LinearRouter {
 public:
  // weight [num_experts, model_dim]; bias [num_experts] or empty (gpt-oss's router has one, Qwen3's not).
  // correction_bias [num_experts] or empty: DeepSeek-V3's selection bias, which is not a logit bias.
  // Throws naming the field when the sizes disagree with config.num_experts.
  LinearRouter(kernels::PackedWeight weight, std::vector<float> bias, const LlmRouterConfig& config,
               const kernels::KernelTable& table, std::vector<float> correction_bias = {});

  const LlmRouterConfig& config() const { return config_; }
  size_t bytes() const { return weight_.bytes() + (bias_.size() + correction_bias_.size()) * sizeof(float); }

  // x [tokens, model_dim] → ids, weights [tokens, top_k], each token's choices best first.
  void route(const float* x, int64_t tokens, int32_t* ids, float* weights);

 private:
  kernels::PackedWeight weight_;
  std::vector<float> bias_, correction_bias_;
  LlmRouterConfig config_;
  const kernels::KernelTable* table_;
  Buffer<float> logits_;
};

}  // namespace xmoe::moe
