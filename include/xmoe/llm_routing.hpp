// Forward-only routers of MoE LLMs, for any expert count. Ties go to the lower expert index.
#pragma once
#include <cstdint>
#include <string>

namespace xmoe {

enum class LlmRouterType {
  qwen3,        // softmax over E, top-k, optional renormalisation (norm_topk_prob)
  deepseek_v3,  // sigmoid + correction bias, group-limited selection, weights from the unbiased sigmoid
  kimi_k2,      // the DeepSeek-V3 form with a single group
  gpt_oss,      // top-k on the logits, softmax over the selected k
};

LlmRouterType parse_llm_router_type(const std::string& name);  // throws xmoe::Error naming the value

struct LlmRouterConfig {
  LlmRouterType type = LlmRouterType::qwen3;
  int num_experts = 0;
  int top_k = 0;
  bool norm_topk_prob = true;  // qwen3, deepseek_v3, kimi_k2 (gpt_oss always softmaxes the selected k)
  int n_group = 1;             // deepseek_v3 only: kimi_k2 always routes with a single group
  int topk_group = 1;          // deepseek_v3 only
  double routed_scaling_factor = 1.0;  // deepseek_v3, kimi_k2 (validated for every type)
};

void validate(const LlmRouterConfig& config);  // throws xmoe::Error naming the field

// logits: [tokens, num_experts] f32. correction_bias: [num_experts] (deepseek_v3 / kimi_k2; null = zeros).
// Writes ids and weights [tokens, top_k], each token's choices in descending selection score.
// Results do not depend on the thread count.
void llm_route(const LlmRouterConfig& config, const float* logits, const float* correction_bias,
               int64_t tokens, int32_t* ids, float* weights);

}  // namespace xmoe
