#include "llm/model.hpp"

#include "llm/qwen3_moe.hpp"
#include "xmoe/error.hpp"

namespace xmoe::llm {

KvCacheShape CausalLM::kv_cache_shape() const {
  const ModelConfig& c = config();
  return KvCacheShape{c.num_hidden_layers, c.num_key_value_heads, c.head_dim};
}

std::unique_ptr<CausalLM> load_model(const Checkpoint& checkpoint, const LoadOptions& options) {
  const std::string& arch = checkpoint.config().architecture;
  if (arch == "Qwen3MoeForCausalLM") return load_qwen3_moe(checkpoint, options);
  throw Error(checkpoint.dir() + "/config.json: architectures: '" + arch +
              "' is not supported (supported: Qwen3MoeForCausalLM)");
}

}  // namespace xmoe::llm
