// What generic code (the prefill FLOP count `xmoe generate --measure-bandwidth` prints) needs to know about
// an architecture's layers beyond ModelConfig's shared fields: an architecture whose layers are more than GQA
// attention and routed experts implements LayerShapeFields on its ArchitectureConfig extension.
#pragma once
#include <cstdint>
#include <optional>

#include "llm/arch/mla_attention.hpp"
#include "llm/model_config.hpp"

namespace xmoe::llm {

class LayerShapeFields {
 public:
  // Every layer's attention is MLA of these dims (nullopt: GQA of ModelConfig's heads and head_dim).
  virtual std::optional<MlaDims> mla_dims(const ModelConfig&) const { return std::nullopt; }
  // The intermediate size of the shared experts every token of a MoE layer runs (0: none).
  virtual int64_t shared_expert_intermediate(const ModelConfig&) const { return 0; }

 protected:
  ~LayerShapeFields() = default;
};

// c's extension as LayerShapeFields, or nullptr when its architecture has none.
inline const LayerShapeFields* layer_shape_fields(const ModelConfig& c) {
  return dynamic_cast<const LayerShapeFields*>(c.extension.get());
}

}  // namespace xmoe::llm
