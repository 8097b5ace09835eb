// What an LLM's gated experts compute, beyond their weights: the activation that joins the gate and up
// projections, where gate and up rows lie in a fused gate_up weight, and whether the projections carry
// biases. Architectures describe their experts with one of these instead of naming an activation by string.
#pragma once
#include <cstdint>
#include <string>

namespace xmoe::moe {

enum class GatedActivation : uint8_t {
  swiglu,          // silu(gate) · up  (Qwen3, DeepSeek, Mixtral)
  clamped_swiglu,  // gpt-oss: g = min(gate, limit), u = clamp(up, −limit, limit), (u + 1) · g · σ(alpha · g)
};
const char* gated_activation_name(GatedActivation a);  // "swiglu", "clamped_swiglu"

enum class GateUpLayout : uint8_t {
  separate,     // gate and up are two [I, H] weights (or one [2I, H] with the gate rows first)
  interleaved,  // one [2I, H] weight: row 2j is gate j, row 2j + 1 is up j (gpt-oss)
};

struct ExpertDescriptor {
  GatedActivation activation = GatedActivation::swiglu;
  float alpha = 1.702f;  // clamped_swiglu: the sigmoid's gain
  float limit = 7.0f;    // clamped_swiglu: the clamp
  GateUpLayout gate_up_layout = GateUpLayout::separate;
  bool gate_up_bias = false;  // a bias on the gate/up outputs, in the weight's row order
  bool down_bias = false;     // a bias on the down projection's output

  static ExpertDescriptor qwen3() { return {}; }
  // transformers' GptOssExperts: clamped SwiGLU, interleaved gate/up rows, both biases.
  static ExpertDescriptor gpt_oss(float alpha, float limit) {
    return {GatedActivation::clamped_swiglu, alpha, limit, GateUpLayout::interleaved, true, true};
  }
  std::string describe() const;  // for messages: "clamped_swiglu(alpha=1.702, limit=7), interleaved, biases"
};

// out[j] = act(gate j, up j) for j < n, reading gate/up from gate_up [2n] in the descriptor's layout
// (separate: gate [0, n), up [n, 2n); interleaved: gate at even, up at odd positions). The plain reference
// of the activation; f32 throughout, as transformers computes it in f32.
void gated_activation_row(const ExpertDescriptor& d, const float* gate_up, float* out, int64_t n);

}  // namespace xmoe::moe
