// The MoE layer's dispatch → experts → combine with routing decided outside (an LLM router such as
// xmoe::llm_route), run the grouped dropless way in eval mode: Tutel's locations, capacity 0 (= the largest
// expert count, so nothing drops), the grouped row plan, SwiGLU experts over weight views in any format
// (packed_experts.hpp) of any ExpertDescriptor, and a combine weighted by the given top-k weights
// (postscore). This is the entry point the LLM models run their MoE blocks through. Activations are f32.
#pragma once
#include <cstdint>
#include <vector>

#include "moe/expert_scratch.hpp"
#include "moe/packed_experts.hpp"
#include "moe/routing.hpp"

namespace xmoe::moe {

class RoutedExperts {
 public:
  RoutedExperts(std::vector<SwigluWeights> experts, const kernels::KernelTable& table,
                const ExpertDescriptor& descriptor = {});

  const PackedSwigluExperts& experts() const { return experts_; }

  // x: [tokens, model_dim]; ids, weights: [tokens, top_k] (row-major, each token's choices in any order);
  // y: [tokens, model_dim] = Σ_j weights[t, j] · expert_{ids[t, j]}(x[t]), accumulated in f32 in choice
  // order. A token's result depends only on its own row (the experts run rows independently).
  void forward(const float* x, int64_t tokens, int top_k, const int32_t* ids, const float* weights, float* y);
  // The same with its rows in `scratch` (the caller's, shared with other layers).
  void forward(const float* x, int64_t tokens, int top_k, const int32_t* ids, const float* weights, float* y,
               ExpertScratch& scratch);

 private:
  const kernels::KernelTable* table_;
  PackedSwigluExperts experts_;
  std::vector<int32_t> ids_, locations_, counts_;
  std::vector<ExpertRange> ranges_;
  RowPlan plan_;
  ExpertScratch own_;  // the scratch of the calls that bring none
};

}  // namespace xmoe::moe
