// Inference experts over weights in any format, as views (an LLM's MoE block: the bytes stay in the mapped
// checkpoint). SwiGLU, y = down · (silu(gate · x) ⊙ (up · x)), each product through the kernel table's
// linear kernel for the weight's format, activations in f32. The training layer's experts (experts.hpp)
// own stacked parameters and gradients; these own nothing but scratch.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "kernels/kernels.hpp"
#include "moe/experts.hpp"
#include "util/buffer.hpp"

namespace xmoe::moe {

// One expert's weights: gate and up [hidden, model_dim], down [model_dim, hidden].
struct SwigluWeights {
  kernels::PackedWeight gate, up, down;
  size_t bytes() const { return gate.bytes() + up.bytes() + down.bytes(); }
};

class PackedSwigluExperts {
 public:
  // Throws naming the expert when the shapes disagree (all experts share model_dim and hidden).
  PackedSwigluExperts(std::vector<SwigluWeights> experts, const kernels::KernelTable& table);

  int num_experts() const { return static_cast<int>(experts_.size()); }
  int64_t model_dim() const { return model_dim_; }
  int64_t hidden() const { return hidden_; }
  const SwigluWeights& expert(int e) const { return experts_[static_cast<size_t>(e)]; }

  // Rows [begin, end) of x [total_rows, model_dim] go to expert `expert`; y [total_rows, model_dim]. A row's
  // result depends on that row alone.
  void forward_rows(const float* x, std::span<const ExpertRange> ranges, int64_t total_rows, float* y);

 private:
  const kernels::KernelTable* table_;
  std::vector<SwigluWeights> experts_;
  std::vector<kernels::PackedWeight> gate_up_;  // gate and up joined, where they lie back to back
  std::vector<char> joined_;                    // by expert: gate_up_ holds its joined view
  int64_t model_dim_ = 0, hidden_ = 0;
  Buffer<float> gu_, act_;
};

}  // namespace xmoe::moe
