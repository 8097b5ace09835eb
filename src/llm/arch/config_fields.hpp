// Shared parsing helpers for the typed configs of the architectures: a reader of one JSON object whose errors
// name the file and the field, and the config.json fields most decoder LLMs share (sizes, heads, RoPE and its
// scaling, per-layer attention kinds, MoE sizes, token ids). An architecture's parse_config calls the ones it
// needs with its own defaults (transformers' config class defaults) and then checks what it does not support.
#pragma once
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "llm/model_config.hpp"

namespace xmoe::llm {

constexpr int64_t kMaxConfigInt = std::numeric_limits<int32_t>::max();
constexpr int64_t kMaxConfigSize = int64_t{1}
                                   << 40;  // beyond any model dimension, small enough not to overflow

const char* json_type_name(const nlohmann::json& v);

// Reads the fields of one JSON object (config.json itself or a nested dict such as rope_parameters) with
// messages that name the file and the field. Absent keys and JSON null both mean "use the default", as
// transformers treats them.
class FieldReader {
 public:
  FieldReader(const nlohmann::json& object, std::string where, std::string prefix = "")
      : obj_(object), where_(std::move(where)), prefix_(std::move(prefix)) {}

  const std::string& where() const { return where_; }
  bool has(const char* key) const { return obj_.contains(key) && !obj_.at(key).is_null(); }
  const nlohmann::json& at(const char* key) const { return obj_.at(key); }
  // "<file>: field '<prefix><key>'", the start of every message about the field.
  std::string field(const char* key) const { return where_ + ": field '" + prefix_ + key + "'"; }

  std::optional<int64_t> opt_int(const char* key, int64_t lo, int64_t hi) const;
  int64_t get_int(const char* key, int64_t def, int64_t lo, int64_t hi) const {
    return opt_int(key, lo, hi).value_or(def);
  }
  std::optional<double> opt_number(const char* key) const;  // finite
  double get_positive(const char* key, double def) const;
  bool get_bool(const char* key, bool def) const;
  std::optional<std::string> opt_string(const char* key) const;

  // v as an integer in [lo, hi] (transformers' strict dataclass refuses 64.0 for an int field too).
  static int64_t int_value(const nlohmann::json& v, const std::string& what, int64_t lo, int64_t hi);

 private:
  const nlohmann::json& obj_;
  std::string where_;
  std::string prefix_;
};

// The defaults of transformers' config class for the shared fields (they differ per architecture).
struct DecoderDefaults {
  int64_t vocab_size = 32000, hidden_size = 4096, intermediate_size = 11008, moe_intermediate_size = 0;
  int num_hidden_layers = 32, num_attention_heads = 32, num_key_value_heads = 32;
  int num_experts = 0, num_experts_per_tok = 0;
  double rms_norm_eps = 1e-6, rope_theta = 10000.0;
  int64_t max_position_embeddings = 2048;
  bool tie_word_embeddings = false, attention_bias = false;
};

// vocab_size, hidden_size, intermediate_size, num_hidden_layers, attention heads / kv heads / head_dim,
// rms_norm_eps, max_position_embeddings, tie_word_embeddings, attention_bias, RoPE (rope_theta, rope_scaling
// or v5 rope_parameters, partial_rotary_factor → rotary_dim), bos/eos token ids and the dtype.
void parse_decoder_fields(const FieldReader& r, const DecoderDefaults& d, ModelConfig& c);

// num_experts (or num_local_experts), num_experts_per_tok, moe_intermediate_size, norm_topk_prob,
// decoder_sparse_step, mlp_only_layers, with the checks that the layers they make sparse / dense need.
void parse_moe_fields(const FieldReader& r, const DecoderDefaults& d, ModelConfig& c);

// layer_types ("full_attention" / "sliding_attention", one per layer) and sliding_window (a sliding layer
// attends to the last sliding_window positions, itself included). Without layer_types every layer is full.
void parse_layer_types(const FieldReader& r, ModelConfig& c);

}  // namespace xmoe::llm
