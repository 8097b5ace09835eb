// Hugging Face config.json of the supported causal-LM architectures: the fields decoder LLMs share, typed,
// plus the architecture's own typed extension (ArchitectureConfig). Each architecture parses its config in
// its own file (src/llm/arch/<name>.cpp) from the shared helpers of src/llm/arch/config_fields.hpp.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <typeinfo>
#include <vector>

#include "xmoe/error.hpp"

namespace xmoe::llm {

// config.json "rope_scaling" (null/absent = none). type: "default" | "linear" | "dynamic" | "yarn" |
// "llama3".
struct RopeScaling {
  std::string type = "default";
  std::string source = "rope_scaling";  // the config key it came from (rope_scaling / rope_parameters)
  double factor = 1.0;
  int64_t original_max_position_embeddings = 0;
  double low_freq_factor = 1.0, high_freq_factor = 4.0;  // llama3
  double beta_fast = 32.0, beta_slow = 1.0;              // yarn
  bool truncate = true;                                  // yarn: round the correction range to integers
  std::optional<double> attention_factor;                // yarn / longrope
};

// What attention a layer runs: causal over every earlier position, or over the last sliding_window ones.
enum class AttentionKind { full, sliding };

// Fields only one architecture has (gpt-oss's swiglu_limit, ...): the architecture derives from this and
// ModelConfig::arch<T>() gives it back typed.
struct ArchitectureConfig {
  virtual ~ArchitectureConfig() = default;
};

struct ModelConfig {
  std::string architecture;  // architectures[0], e.g. "Qwen3MoeForCausalLM"
  std::string model_type;    // e.g. "qwen3_moe"
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;      // dense MLP layers
  int64_t moe_intermediate_size = 0;  // each expert
  int num_hidden_layers = 0;
  int num_attention_heads = 0;
  int num_key_value_heads = 0;
  int head_dim = 0;  // config's head_dim, else hidden_size / num_attention_heads
  int num_experts = 0;
  int num_experts_per_tok = 0;
  bool norm_topk_prob = false;
  int decoder_sparse_step = 1;
  std::vector<int> mlp_only_layers;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  std::optional<RopeScaling> rope_scaling;
  double partial_rotary_factor = 1.0;
  int rotary_dim = 0;  // int(head_dim · partial_rotary_factor): the leading dims of a head RoPE rotates
  int64_t max_position_embeddings = 0;
  bool tie_word_embeddings = false;
  bool attention_bias = false;
  std::vector<AttentionKind> layer_types;  // one per layer (empty: every layer full)
  int64_t sliding_window = 0;              // tokens a sliding layer sees, itself included
  std::optional<int32_t> bos_token_id;
  std::vector<int32_t> eos_token_ids;                   // eos_token_id may be an int or a list
  std::string torch_dtype;                              // "bfloat16", "float32", ... (informational)
  std::shared_ptr<const ArchitectureConfig> extension;  // the architecture's own fields, if it has any

  // Layer i runs the MoE block (else the dense MLP): not in mlp_only_layers, num_experts > 0 and
  // (i + 1) % decoder_sparse_step == 0, as transformers decides.
  bool is_sparse_layer(int i) const;
  // Positions layer i attends to besides its own: 0 = all (full attention), else sliding_window.
  int64_t attention_window(int i) const;
  // The architecture's typed extension (throws when the config was parsed for another architecture).
  template <class T>
  const T& arch() const {
    const T* t = dynamic_cast<const T*>(extension.get());
    XMOE_CHECK(t != nullptr, "model config of ", architecture, " has no ", typeid(T).name(), " fields");
    return *t;
  }
};

// Parses and validates config.json through the registered architecture (src/llm/arch/registry.cpp); throws
// xmoe::Error naming the file and the field (missing, wrong type, out of range, contradictory, unknown
// architecture).
ModelConfig parse_model_config(const std::string& config_json_path);
ModelConfig parse_model_config_text(const std::string& json_text, const std::string& where);

}  // namespace xmoe::llm
