// Batched experts over rows grouped by expert: rows [offsets[e], offsets[e+1]) of x go to local expert e.
// The same code serves Tutel's padded [E, C, M] buffer (offsets = e·C) and the grouped dropless layout.
#pragma once
#include <memory>
#include <span>
#include <vector>

#include "moe/compute.hpp"
#include "xmoe/moe_layer.hpp"

namespace xmoe::moe {

template <class S>
class Experts {
 public:
  using Acc = acc_t<S>;
  virtual ~Experts() = default;
  virtual int64_t output_dim() const = 0;
  virtual void forward(const Ops<S>& ops, const S* x, std::span<const int64_t> offsets, S* y) = 0;
  // x is the forward's input (unchanged since); dy [R, O] → dx [R, M]; accumulates parameter gradients.
  virtual void backward(const Ops<S>& ops, const S* x, const S* dy, std::span<const int64_t> offsets,
                        Acc* dx) = 0;
  virtual size_t workspace_bytes() const = 0;
};

// Creates the experts named by config.experts.type; appends their parameters (from config.seed_experts).
template <class S>
std::unique_ptr<Experts<S>> make_experts(const MoeConfig& config,
                                         std::vector<std::unique_ptr<Parameter>>& params);

kernels::Activation parse_activation(const std::string& name);  // throws naming experts.activation

}  // namespace xmoe::moe
