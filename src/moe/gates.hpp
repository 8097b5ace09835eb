// Trainable gates: x [T, M] → logits [T, E], and their backward.
#pragma once
#include <memory>
#include <vector>

#include "moe/compute.hpp"
#include "util/buffer.hpp"
#include "xmoe/moe_layer.hpp"

namespace xmoe::moe {

template <class S>
class Gate {
 public:
  using Acc = acc_t<S>;
  virtual ~Gate() = default;
  virtual void forward(const Ops<S>& ops, const S* x, int64_t tokens, Acc* logits) = 0;
  // Accumulates parameter gradients and adds the gate's share of dx into dx [T, M].
  virtual void backward(const Ops<S>& ops, const S* x, int64_t tokens, const Acc* dlogits, Acc* dx) = 0;
  virtual size_t workspace_bytes() const = 0;
};

// Creates the gate named by config.gate.type; appends its parameters (initialised from config.seed_gate).
template <class S>
std::unique_ptr<Gate<S>> make_gate(const MoeConfig& config, std::vector<std::unique_ptr<Parameter>>& params);

}  // namespace xmoe::moe
