#include "moe/expert_descriptor.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

namespace xmoe::moe {

const char* gated_activation_name(GatedActivation a) {
  switch (a) {
    case GatedActivation::swiglu:
      return "swiglu";
    case GatedActivation::clamped_swiglu:
      return "clamped_swiglu";
  }
  return "?";
}

std::string ExpertDescriptor::describe() const {
  std::ostringstream s;
  s << gated_activation_name(activation);
  if (activation == GatedActivation::clamped_swiglu) s << "(alpha=" << alpha << ", limit=" << limit << ")";
  s << (gate_up_layout == GateUpLayout::interleaved ? ", interleaved gate/up" : ", separate gate/up");
  if (gate_up_bias) s << ", gate_up bias";
  if (down_bias) s << ", down bias";
  return s.str();
}

void gated_activation_row(const ExpertDescriptor& d, const float* gu, float* out, int64_t n) {
  const bool inter = d.gate_up_layout == GateUpLayout::interleaved;
  const int64_t gate_step = inter ? 2 : 1;
  const float* gate = gu;
  const float* up = inter ? gu + 1 : gu + n;
  switch (d.activation) {
    case GatedActivation::swiglu:
      for (int64_t j = 0; j < n; ++j) {
        const float g = gate[j * gate_step];
        out[j] = g / (1.0f + std::exp(-g)) * up[j * gate_step];
      }
      break;
    case GatedActivation::clamped_swiglu:
      // transformers: gate.clamp(max=limit), up.clamp(-limit, limit), glu = gate * sigmoid(gate * alpha),
      // (up + 1) * glu. std::min/max keep torch.clamp's order of operands for finite values.
      for (int64_t j = 0; j < n; ++j) {
        const float g = std::min(gate[j * gate_step], d.limit);
        const float u = std::clamp(up[j * gate_step], -d.limit, d.limit);
        const float glu = g * (1.0f / (1.0f + std::exp(-(g * d.alpha))));
        out[j] = (u + 1.0f) * glu;
      }
      break;
  }
}

}  // namespace xmoe::moe
