// The typed engine behind MoeLayer: one instance per storage type (f32, bf16, f64).
#pragma once
#include <chrono>
#include <memory>
#include <vector>

#include "moe/compute.hpp"
#include "moe/experts.hpp"
#include "moe/gates.hpp"
#include "moe/routing.hpp"
#include "util/buffer.hpp"
#include "xmoe/communicator.hpp"
#include "xmoe/moe_layer.hpp"

namespace xmoe::moe {

class LayerEngineBase {
 public:
  virtual ~LayerEngineBase() = default;
  virtual ForwardResult forward(const Tensor& x, const Switches& sw, RoutingSummary& summary,
                                PhaseTimes& times) = 0;
  virtual Tensor backward(const Tensor& dy, double daux, PhaseTimes& times) = 0;
  virtual int64_t output_dim() const = 0;
  virtual size_t workspace_bytes() const = 0;
};

// group: null or size 1 for a single-process layer, else the expert-parallel group.
std::unique_ptr<LayerEngineBase> make_layer_engine(const MoeConfig& config, const kernels::KernelTable& table,
                                                   Communicator* group,
                                                   std::vector<std::unique_ptr<Parameter>>& params);

}  // namespace xmoe::moe
