// The tensors of transformers' Qwen3MoeForCausalLM checkpoint, with their exact names and shapes, in module
// order (embeddings, each layer's attention then MLP, final norm, lm_head).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "llm/model_config.hpp"

namespace xmoe::app {

enum class ExpertLayout {
  per_expert,  // mlp.experts.{j}.{gate,up,down}_proj.weight: what checkpoints on the Hub hold
  fused,       // mlp.experts.gate_up_proj [E, 2I, H] (gate rows, then up rows) and down_proj [E, H, I]: v5
};

enum class TensorInit { normal, ones, zeros };

// A run of a tensor's elements taken from the first `count` values of another (logical) tensor's random
// stream: a fused expert tensor is the concatenation of its per-expert tensors, so both layouts of one seed
// hold the same model.
struct StreamSegment {
  std::string source;
  int64_t count = 0;
};

struct PlannedTensor {
  std::string name;
  std::vector<int64_t> shape;
  TensorInit init = TensorInit::normal;
  std::vector<StreamSegment> segments;  // init == normal: covering all numel() elements in order
  int64_t numel() const;
};

std::vector<PlannedTensor> qwen3_moe_tensors(const llm::ModelConfig& config, ExpertLayout layout);

}  // namespace xmoe::app
