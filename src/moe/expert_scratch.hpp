// Scratch rows of a feed-forward block's forward (moe::RoutedExperts, PackedSwigluExperts, the LLM dense
// SwiGLU and MoE blocks): the dispatched copies of the routed tokens, the experts' outputs, the gate/up and
// activation rows, and a shared expert's output. Grow-only. A model keeps one and lends it to every layer in
// turn (they run one after another), so a 512-token prefill chunk holds one layer's scratch rather than one
// per layer: per MoE layer that is 4 · R · (2 · model_dim + 3 · intermediate) bytes for R = tokens · top_k
// rows, 105 MB at Qwen3-30B-A3B's shape and 335 MB at DeepSeek-V3's.
#pragma once

#include "util/buffer.hpp"

namespace xmoe::moe {

struct ExpertScratch {
  Buffer<float> dispatched, expert_out;  // [rows, model_dim] each (routed experts)
  Buffer<float> gate_up, act;            // [rows, 2 · intermediate] and [rows, intermediate]
  Buffer<float> shared_out;              // [tokens, model_dim]: an LLM MoE block's shared experts
};

}  // namespace xmoe::moe
