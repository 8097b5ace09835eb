// Floating-point operations a prompt's prefill performs, from config.json alone: what `xmoe generate
// --measure-bandwidth` divides by the prefill time to report GFLOP/s next to the register-only FMA peak.
#pragma once
#include <cstdint>

#include "llm/model_config.hpp"

namespace xmoe::app {

// 2 per multiply-add, for a prompt of `tokens` tokens fed from an empty cache in one chunk: every layer's
// attention projections and attention itself, the feed-forward side, and the lm_head for the last position
// only (the engine computes logits just where it samples).
// - GQA: q, k, v, o; scores q·kᵀ and the weighted sum p·v per query head over the keys each position sees
//   (all earlier ones and itself, or the last sliding_window on sliding layers).
// - MLA (llm/arch/layer_shapes.hpp: DeepSeek-V3/V3.2, Kimi-K2, GLM-4.7-Flash): q_a and q_b (or q_proj),
//   kv_a, kv_b in the expanded prefill form (every position's k_nope and v), o; scores over qk_nope +
//   qk_rope and values of v_head_dim per head. DeepSeek-V3.2's indexer is not run (contexts up to
//   index_topk) and not counted.
// - MoE layers: the router, top-k routed experts' gate/up/down and the shared experts; dense layers
//   (mlp_only_layers, DeepSeek's first_k_dense_replace) the dense MLP.
// Norms, RoPE, softmax, SiLU, biases and attention sinks are left out (a few operations per element, well
// under 1 % here).
double prefill_flops(const llm::ModelConfig& c, int64_t tokens);

}  // namespace xmoe::app
