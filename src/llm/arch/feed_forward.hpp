// Feed-forward blocks of the architecture kit: the dense SwiGLU MLP and the routed MoE block (a router kind
// from xmoe/llm_routing.hpp over a linear's logits, SwiGLU experts run through moe::RoutedExperts). An
// architecture picks one per layer in its DecoderSpec::feed_forward hook, with its own tensor names.
#pragma once
#include <functional>
#include <memory>
#include <string>

#include "llm/arch/decoder.hpp"
#include "xmoe/llm_routing.hpp"

namespace xmoe::llm {

// down(silu(gate(x)) · up(x)): weight tensors [I, H], [I, H], [H, I].
struct DenseMlpNames {
  std::string gate, up, down;
};
std::unique_ptr<FeedForward> load_dense_swiglu(DecoderLoader& loader, const DenseMlpNames& names,
                                               int64_t hidden, int64_t intermediate);

// A MoE block's tensors: the router's weight [E, H] (and bias [E] when router_bias is set), and the experts
// either one tensor per expert and projection (`expert(e, "gate_proj")` → "<...>.weight", [I, H] / [I, H] /
// [H, I]) or fused: fused_gate_up [E, 2I, H] (gate rows, then up rows) and fused_down [E, H, I].
//
// DeepSeek-V3-style blocks (GLM-4.5+, Kimi-K2) add:
// - correction_bias: e_score_correction_bias [E] (read as f32), added to the router's scores for the choice
//   of experts only (llm_route's correction_bias; the deepseek_v3 / kimi_k2 router types);
// - shared experts: a dense SwiGLU of intermediate shared_intermediate (moe_intermediate_size ×
//   n_shared_experts) that every token runs, its output added to the routed output (routed + shared, as
//   transformers' DeepseekV3MoE / Glm4MoeMoE). shared_intermediate = 0: none.
struct MoeNames {
  std::string router, router_bias;
  std::string correction_bias;
  std::function<std::string(int expert, const char* proj)> expert;
  std::string fused_gate_up, fused_down;
  DenseMlpNames shared;
  int64_t shared_intermediate = 0;
};
std::unique_ptr<FeedForward> load_swiglu_moe(DecoderLoader& loader, const MoeNames& names,
                                             const LlmRouterConfig& router, int64_t hidden,
                                             int64_t intermediate, int layer);

}  // namespace xmoe::llm
