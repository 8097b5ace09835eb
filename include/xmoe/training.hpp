// Training helpers for (expert-)parallel MoE layers: shared parameters are replicated on every rank and their
// gradients averaged over the data-parallel group; expert parameters live on their owner and their gradients
// (already the sum over every rank's tokens routed to them) are never all-reduced.
#pragma once
#include <map>
#include <string>

#include "xmoe/communicator.hpp"
#include "xmoe/moe_layer.hpp"

namespace xmoe {

// Divides every shared (non-expert) gradient by the group size and all-reduces it; expert gradients
// untouched.
void average_shared_gradients(MoeLayer& layer, Communicator& group);

struct SgdOptions {
  double lr = 1e-4;
  double momentum = 0.0;
  double weight_decay = 0.0;  // added to the gradient (L2), as torch.optim.SGD
};

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weight_decay = 0.0;  // decoupled (AdamW) when > 0
};

// Optimizers over a layer's parameters (state kept per parameter name, in the gradient's precision). They
// step whatever gradients are present: call average_shared_gradients first in data/expert-parallel training.
class Sgd {
 public:
  explicit Sgd(SgdOptions options);
  void step(MoeLayer& layer);  // then zero_grad

 private:
  SgdOptions o_;
  std::map<std::string, Tensor> momentum_;
};

class Adam {
 public:
  explicit Adam(AdamOptions options);
  void step(MoeLayer& layer);  // then zero_grad

 private:
  AdamOptions o_;
  int64_t t_ = 0;
  std::map<std::string, Tensor> m_, v_;
};

}  // namespace xmoe
