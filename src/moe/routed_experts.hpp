// The MoE layer's dispatch → experts → combine with routing decided outside (an LLM router such as
// xmoe::llm_route), run the grouped dropless way in eval mode: Tutel's locations, capacity 0 (= the largest
// expert count, so nothing drops), the grouped row plan, the layer's Experts, and a combine weighted by the
// given top-k weights (postscore). This is the entry point the LLM models run their MoE blocks through.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "moe/compute.hpp"
#include "moe/experts.hpp"
#include "moe/routing.hpp"
#include "util/buffer.hpp"
#include "xmoe/moe_layer.hpp"

namespace xmoe::moe {

template <class S>
class RoutedExperts {
 public:
  using Acc = acc_t<S>;
  // config: experts (type, num_experts, hidden_size, ...), model_dim, dtype (must be S). Expert parameters
  // start zero and carry no gradients; the caller loads them through parameter().
  RoutedExperts(const MoeConfig& config, const kernels::KernelTable& table);

  Parameter& parameter(const std::string& name);  // "experts.gate_proj", ...; throws naming it when unknown
  int64_t output_dim() const { return experts_->output_dim(); }

  // x: [tokens, model_dim]; ids, weights: [tokens, top_k] (row-major, each token's choices in any order);
  // y: [tokens, output_dim] = Σ_j weights[t, j] · expert_{ids[t, j]}(x[t]), accumulated in Acc in choice
  // order. A token's result depends only on its own row (the experts run rows independently).
  void forward(const S* x, int64_t tokens, int top_k, const int32_t* ids, const float* weights, Acc* y);

 private:
  MoeConfig config_;
  Ops<S> ops_;
  std::vector<std::unique_ptr<Parameter>> params_;
  std::unique_ptr<Experts<S>> experts_;
  std::vector<int32_t> ids_, locations_, counts_;
  RowPlan plan_;
  Buffer<S> dispatched_, expert_out_;
};

}  // namespace xmoe::moe
