#include "llm/model.hpp"

#include "llm/arch/architecture.hpp"
#include "xmoe/error.hpp"

namespace xmoe::llm {

KvCacheShape CausalLM::kv_cache_shape() const {
  const ModelConfig& c = config();
  KvCacheShape shape{c.num_hidden_layers, c.num_key_value_heads, c.head_dim, {}};
  bool any_window = false;
  for (int i = 0; i < c.num_hidden_layers; ++i) any_window |= c.attention_window(i) > 0;
  if (any_window)
    for (int i = 0; i < c.num_hidden_layers; ++i) shape.layer_window.push_back(c.attention_window(i));
  return shape;
}

std::unique_ptr<CausalLM> load_model(const Checkpoint& checkpoint, const LoadOptions& options) {
  const std::string& arch = checkpoint.config().architecture;
  const Architecture* a = find_architecture(arch);
  if (a == nullptr)
    throw Error(checkpoint.dir() + "/config.json: architectures: '" + arch +
                "' is not supported (supported: " + supported_architecture_names() + ")");
  return a->load(checkpoint, options);
}

}  // namespace xmoe::llm
