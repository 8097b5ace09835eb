// Inference experts over weights in any format, as views (an LLM's MoE block: the bytes stay in the mapped
// checkpoint). Gated experts, y = down · act(gate · x + b_gate, up · x + b_up) + b_down, each product through
// the kernel table's linear kernel for the weight's format, activations in f32; the activation, the gate/up
// row layout and the biases come from an ExpertDescriptor (Qwen3's plain SwiGLU by default, gpt-oss's clamped
// SwiGLU over interleaved rows with biases). The training layer's experts (experts.hpp) own stacked
// parameters and gradients; these own nothing but scratch and the biases (small, widened to f32).
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "kernels/kernels.hpp"
#include "moe/expert_descriptor.hpp"
#include "moe/expert_scratch.hpp"
#include "moe/expert_tiles.hpp"
#include "moe/experts.hpp"

namespace xmoe::moe {

// One expert's weights. Separate layout: gate and up [hidden, model_dim]. Interleaved layout: gate_up
// [2·hidden, model_dim] with gate rows even and up rows odd. down [model_dim, hidden] either way. Biases
// (when the descriptor has them): gate_up_bias [2·hidden] in the gate/up row order (separate: gate then up),
// down_bias [model_dim].
struct SwigluWeights {
  kernels::PackedWeight gate, up, gate_up, down;
  std::vector<float> gate_up_bias, down_bias;
  size_t bytes() const {
    return gate.bytes() + up.bytes() + gate_up.bytes() + down.bytes() +
           (gate_up_bias.size() + down_bias.size()) * sizeof(float);
  }
};

// Down tiles at least this wide compute their rows' activation themselves: an activation element costs
// about as much as a few of the tile's multiply-adds per element, so it adds a few percent to such a tile,
// less than a barrier of the team (at decode and at an even prefill histogram the tiles are an expert's
// columns split across the threads). When any tile is narrower (a heavily routed expert's columns cut
// finer, a small model), one shared activation pass runs instead.
inline constexpr int64_t kFusedActivationColumns = 256;

class PackedSwigluExperts {
 public:
  // Throws naming the expert when the shapes disagree with each other or with the descriptor (all experts
  // share model_dim and hidden).
  PackedSwigluExperts(std::vector<SwigluWeights> experts, const kernels::KernelTable& table,
                      const ExpertDescriptor& descriptor = {});

  int num_experts() const { return static_cast<int>(experts_.size()); }
  int64_t model_dim() const { return model_dim_; }
  int64_t hidden() const { return hidden_; }
  const ExpertDescriptor& descriptor() const { return descriptor_; }
  const SwigluWeights& expert(int e) const { return experts_[static_cast<size_t>(e)]; }

  // Rows [begin, end) of x [total_rows, model_dim] go to expert `expert`; y [total_rows, model_dim]. A row's
  // result depends on that row alone, never on the thread count. All experts run as one parallel schedule
  // (expert_tiles.hpp) balanced by the rows each range holds.
  void forward_rows(const float* x, std::span<const ExpertRange> ranges, int64_t total_rows, float* y);
  // The same with the gate/up and activation rows in `scratch` (the caller's, shared with other layers).
  void forward_rows(const float* x, std::span<const ExpertRange> ranges, int64_t total_rows, float* y,
                    ExpertScratch& scratch);

 private:
  const kernels::KernelTable* table_;
  ExpertDescriptor descriptor_;
  std::vector<SwigluWeights> experts_;
  std::vector<kernels::PackedWeight> gate_up_;  // one view of gate and up per expert, where one exists
  std::vector<char> joined_;                    // by expert: gate_up_ holds its view
  int64_t model_dim_ = 0, hidden_ = 0;
  ExpertScratch own_;  // the scratch of the calls that bring none
  std::vector<ExpertTile> gate_up_tiles_, down_tiles_;
  std::vector<ExpertRange> row_chunks_;  // the activation's work items
};

}  // namespace xmoe::moe
