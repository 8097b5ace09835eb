// Floating-point operations a prompt's prefill performs, from config.json alone: what `xmoe generate
// --measure-bandwidth` divides by the prefill time to report GFLOP/s next to the register-only FMA peak.
#pragma once
#include <cstdint>

#include "llm/model_config.hpp"

namespace xmoe::app {

// 2 per multiply-add, for a prompt of `tokens` tokens fed from an empty cache: every layer's attention
// projections (q, k, v, o), causal attention (q·kᵀ and p·v over the keys up to each position), the router and
// the top-k experts' gate/up/down on MoE layers or the dense MLP on the others, and the lm_head for the last
// position only (the engine computes logits just where it samples). Norms, RoPE, softmax and SiLU are left
// out (a few operations per element, well under 1 % here).
double prefill_flops(const llm::ModelConfig& c, int64_t tokens);

}  // namespace xmoe::app
