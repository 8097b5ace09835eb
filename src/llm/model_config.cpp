#include "llm/model_config.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string_view>

#include "util/text_file.hpp"
#include "xmoe/error.hpp"

namespace xmoe::llm {

namespace {

using json = nlohmann::json;

struct Architecture {
  std::string_view name;        // architectures[0]
  std::string_view model_type;  // what transformers' AutoConfig maps it from
};

// Architectures a model class exists for; parse_model_config refuses the rest so a checkpoint we cannot run
// fails at open time with the list, not at the first missing tensor.
constexpr Architecture kArchitectures[] = {
    {"Qwen3MoeForCausalLM", "qwen3_moe"},
};

std::string supported_architectures() {
  std::string s;
  for (const auto& a : kArchitectures) {
    if (!s.empty()) s += ", ";
    s += a.name;
  }
  return s;
}

const char* json_type(const json& v) {
  if (v.is_number_integer()) return "integer";
  if (v.is_number_float()) return "number";
  return v.type_name();
}

// Reads the fields of one JSON object (config.json itself or its rope_parameters) with messages that name the
// file and the field. Absent keys and JSON null both mean "use the default", as transformers treats them.
class FieldReader {
 public:
  FieldReader(const json& object, std::string where, std::string prefix = "")
      : obj_(object), where_(std::move(where)), prefix_(std::move(prefix)) {}

  bool has(const char* key) const { return obj_.contains(key) && !obj_.at(key).is_null(); }
  const json& at(const char* key) const { return obj_.at(key); }
  std::string field(const char* key) const { return where_ + ": field '" + prefix_ + key + "'"; }

  std::optional<int64_t> opt_int(const char* key, int64_t lo, int64_t hi) const {
    if (!has(key)) return std::nullopt;
    return int_value(obj_.at(key), field(key), lo, hi);
  }
  int64_t get_int(const char* key, int64_t def, int64_t lo, int64_t hi) const {
    return opt_int(key, lo, hi).value_or(def);
  }
  std::optional<double> opt_number(const char* key) const {
    if (!has(key)) return std::nullopt;
    const json& v = obj_.at(key);
    XMOE_CHECK(v.is_number(), field(key), " must be a number, got ", json_type(v), " ", v.dump());
    const double d = v.get<double>();
    XMOE_CHECK(std::isfinite(d), field(key), " must be finite, got ", v.dump());
    return d;
  }
  double get_positive(const char* key, double def) const {
    const double d = opt_number(key).value_or(def);
    XMOE_CHECK(d > 0, field(key), " must be > 0, got ", d);
    return d;
  }
  bool get_bool(const char* key, bool def) const {
    if (!has(key)) return def;
    const json& v = obj_.at(key);
    XMOE_CHECK(v.is_boolean(), field(key), " must be true or false, got ", json_type(v), " ", v.dump());
    return v.get<bool>();
  }
  std::optional<std::string> opt_string(const char* key) const {
    if (!has(key)) return std::nullopt;
    const json& v = obj_.at(key);
    XMOE_CHECK(v.is_string(), field(key), " must be a string, got ", json_type(v), " ", v.dump());
    return v.get<std::string>();
  }

  static int64_t int_value(const json& v, const std::string& what, int64_t lo, int64_t hi) {
    // transformers' strict dataclass refuses 64.0 for an int field too.
    XMOE_CHECK(v.is_number_integer(), what, " must be an integer, got ", json_type(v), " ", v.dump());
    XMOE_CHECK(!v.is_number_unsigned() || v.get<uint64_t>() <= static_cast<uint64_t>(hi), what,
               " must be in [", lo, ", ", hi, "], got ", v.dump());
    const int64_t i = v.get<int64_t>();
    XMOE_CHECK(i >= lo && i <= hi, what, " must be in [", lo, ", ", hi, "], got ", i);
    return i;
  }

 private:
  const json& obj_;
  std::string where_;
  std::string prefix_;
};

constexpr int64_t kMaxInt = std::numeric_limits<int32_t>::max();
constexpr int64_t kMaxSize = int64_t{1}
                             << 40;  // far beyond any model dimension, small enough not to overflow

// The RoPE types the struct can describe; longrope needs per-dimension factor lists it has no room for.
bool known_rope_type(const std::string& t) {
  return t == "default" || t == "linear" || t == "dynamic" || t == "yarn" || t == "llama3";
}

// rope_scaling (transformers v4) or rope_parameters (v5, which also holds rope_theta). Returns the scaling
// (nullopt for "default") and updates rope_theta from the dict when it has one.
std::optional<RopeScaling> parse_rope(const json& rope, const std::string& where, const std::string& key,
                                      int64_t max_position_embeddings, double& rope_theta) {
  XMOE_CHECK(rope.is_object(), where, ": field '", key, "' must be an object or null, got ", json_type(rope),
             " ", rope.dump());
  for (const auto& [k, v] : rope.items())
    XMOE_CHECK(!v.is_object(), where, ": field '", key, ".", k,
               "': per-layer-type RoPE parameters are not supported by Qwen3-MoE");
  const FieldReader r(rope, where, key + ".");
  // transformers: rope_type wins, "type" is the older spelling.
  std::string type = "default";
  if (auto t = r.opt_string("rope_type"))
    type = *t;
  else if (auto t2 = r.opt_string("type"))
    type = *t2;
  XMOE_CHECK(known_rope_type(type), r.field(r.has("rope_type") ? "rope_type" : "type"),
             ": unsupported type '", type, "' (supported: default, linear, dynamic, yarn, llama3)");
  if (auto theta = r.opt_number("rope_theta")) {
    XMOE_CHECK(*theta > 0, r.field("rope_theta"), " must be > 0, got ", *theta);
    rope_theta = *theta;
  }
  if (auto prf = r.opt_number("partial_rotary_factor"))
    XMOE_CHECK(*prf == 1.0, r.field("partial_rotary_factor"), " = ", *prf,
               " is not supported (Qwen3-MoE rotates the whole head)");
  if (type == "default") return std::nullopt;

  RopeScaling s;
  s.type = type;
  // yarn may omit factor and derive it from the two context lengths, as transformers does.
  const std::optional<int64_t> original = r.opt_int("original_max_position_embeddings", 1, kMaxSize);
  if (type == "yarn" && !r.has("factor") && original) {
    s.factor = static_cast<double>(max_position_embeddings) / static_cast<double>(*original);
  } else {
    XMOE_CHECK(r.has("factor"), r.field("factor"), " is missing (required by rope type '", type, "')");
    s.factor = *r.opt_number("factor");
  }
  XMOE_CHECK(s.factor > 0, r.field("factor"), " must be > 0, got ", s.factor);
  if (type == "llama3") {
    XMOE_CHECK(original.has_value(), r.field("original_max_position_embeddings"),
               " is missing (required by rope type 'llama3')");
    for (const char* k : {"low_freq_factor", "high_freq_factor"})
      XMOE_CHECK(r.has(k), r.field(k), " is missing (required by rope type 'llama3')");
    s.low_freq_factor = r.get_positive("low_freq_factor", s.low_freq_factor);
    s.high_freq_factor = r.get_positive("high_freq_factor", s.high_freq_factor);
    XMOE_CHECK(s.high_freq_factor != s.low_freq_factor, r.field("high_freq_factor"),
               " must differ from low_freq_factor (both ", s.low_freq_factor, ")");
  }
  // transformers fills original_max_position_embeddings from max_position_embeddings where it is absent.
  s.original_max_position_embeddings = original.value_or(max_position_embeddings);
  if (type == "yarn") {
    // transformers treats 0 / null as "use the default" here (`or 32`).
    if (auto b = r.opt_number("beta_fast"); b && *b != 0) s.beta_fast = *b;
    if (auto b = r.opt_number("beta_slow"); b && *b != 0) s.beta_slow = *b;
    XMOE_CHECK(!r.has("truncate") || r.get_bool("truncate", true), r.field("truncate"),
               " = false is not supported");
    if (auto a = r.opt_number("attention_factor")) {
      XMOE_CHECK(*a > 0, r.field("attention_factor"), " must be > 0, got ", *a);
      s.attention_factor = *a;
    } else {
      // DeepSeek-style mscale pair: transformers folds it into the attention factor.
      const double mscale = r.opt_number("mscale").value_or(0.0);
      const double mscale_all_dim = r.opt_number("mscale_all_dim").value_or(0.0);
      if (mscale != 0 && mscale_all_dim != 0) {
        auto get_mscale = [&](double m) { return s.factor <= 1 ? 1.0 : 0.1 * m * std::log(s.factor) + 1.0; };
        s.attention_factor = get_mscale(mscale) / get_mscale(mscale_all_dim);
      }
    }
  }
  return s;
}

}  // namespace

bool ModelConfig::is_sparse_layer(int i) const {
  if (num_experts <= 0) return false;
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), i) != mlp_only_layers.end()) return false;
  return (i + 1) % decoder_sparse_step == 0;
}

ModelConfig parse_model_config_text(const std::string& json_text, const std::string& where) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::parse_error& e) {
    throw Error(where + ": malformed JSON at byte " + std::to_string(e.byte) + ": " + e.what());
  } catch (const json::exception& e) {
    throw Error(where + ": malformed JSON: " + e.what());
  }
  XMOE_CHECK(j.is_object(), where, ": must hold a JSON object, got ", json_type(j));
  const FieldReader r(j, where);
  ModelConfig c;

  // The architecture: architectures[0], else the model_type transformers' AutoConfig would map.
  if (r.has("architectures")) {
    const json& a = r.at("architectures");
    XMOE_CHECK(a.is_array() && !a.empty() && a[0].is_string(), r.field("architectures"),
               " must be a non-empty list of strings, got ", a.dump());
    c.architecture = a[0].get<std::string>();
  }
  c.model_type = r.opt_string("model_type").value_or("");
  const Architecture* arch = nullptr;
  for (const auto& a : kArchitectures)
    if (c.architecture.empty() ? a.model_type == c.model_type : a.name == c.architecture) arch = &a;
  XMOE_CHECK(!c.architecture.empty() || !c.model_type.empty(), where,
             ": field 'architectures' is missing (and no 'model_type' either); supported: ",
             supported_architectures());
  XMOE_CHECK(arch != nullptr, c.architecture.empty() ? r.field("model_type") : r.field("architectures"),
             ": unknown architecture '", c.architecture.empty() ? c.model_type : c.architecture,
             "' (supported: ", supported_architectures(), ")");
  c.architecture = std::string(arch->name);
  if (c.model_type.empty()) c.model_type = std::string(arch->model_type);
  XMOE_CHECK(c.model_type == arch->model_type, r.field("model_type"), " is '", c.model_type,
             "' but architecture ", arch->name, " needs '", arch->model_type, "'");

  // Defaults are transformers' Qwen3MoeConfig (v5) ones.
  c.vocab_size = r.get_int("vocab_size", 151936, 1, kMaxInt);
  c.hidden_size = r.get_int("hidden_size", 2048, 1, kMaxSize);
  c.intermediate_size = r.get_int("intermediate_size", 6144, 0, kMaxSize);
  c.moe_intermediate_size = r.get_int("moe_intermediate_size", 768, 0, kMaxSize);
  c.num_hidden_layers = static_cast<int>(r.get_int("num_hidden_layers", 24, 1, kMaxInt));
  c.num_attention_heads = static_cast<int>(r.get_int("num_attention_heads", 32, 1, kMaxInt));
  c.num_key_value_heads = static_cast<int>(r.get_int("num_key_value_heads", 4, 1, kMaxInt));
  XMOE_CHECK(c.num_attention_heads % c.num_key_value_heads == 0, r.field("num_key_value_heads"), " = ",
             c.num_key_value_heads, " must divide num_attention_heads = ", c.num_attention_heads);
  if (r.has("head_dim")) {
    c.head_dim = static_cast<int>(r.get_int("head_dim", 0, 1, kMaxInt));
  } else {
    XMOE_CHECK(c.hidden_size >= c.num_attention_heads, r.field("hidden_size"), " = ", c.hidden_size,
               " is smaller than num_attention_heads = ", c.num_attention_heads,
               " and there is no head_dim to use instead");
    c.head_dim = static_cast<int>(c.hidden_size / c.num_attention_heads);
  }
  XMOE_CHECK(c.head_dim % 2 == 0, r.has("head_dim") ? r.field("head_dim") : r.field("hidden_size"),
             ": head_dim ", c.head_dim, " must be even (RoPE rotates pairs)");

  // transformers v5 writes num_experts under its attribute_map name num_local_experts.
  const char* experts_key = r.has("num_experts") ? "num_experts" : "num_local_experts";
  c.num_experts = static_cast<int>(r.get_int(experts_key, 128, 0, kMaxInt));
  c.num_experts_per_tok = static_cast<int>(r.get_int("num_experts_per_tok", 8, 1, kMaxInt));
  c.norm_topk_prob = r.get_bool("norm_topk_prob", false);
  c.decoder_sparse_step = static_cast<int>(r.get_int("decoder_sparse_step", 1, 1, kMaxInt));
  if (r.has("mlp_only_layers")) {
    const json& m = r.at("mlp_only_layers");
    XMOE_CHECK(m.is_array(), r.field("mlp_only_layers"), " must be a list of layer indices, got ", m.dump());
    for (size_t i = 0; i < m.size(); ++i)
      c.mlp_only_layers.push_back(static_cast<int>(FieldReader::int_value(
          m[i], r.field("mlp_only_layers") + "[" + std::to_string(i) + "]", 0, c.num_hidden_layers - 1)));
  }
  bool any_sparse = false, any_dense = false;
  for (int i = 0; i < c.num_hidden_layers; ++i) (c.is_sparse_layer(i) ? any_sparse : any_dense) = true;
  if (any_sparse) {
    XMOE_CHECK(c.num_experts_per_tok <= c.num_experts, r.field("num_experts_per_tok"), " = ",
               c.num_experts_per_tok, " exceeds ", experts_key, " = ", c.num_experts);
    XMOE_CHECK(c.moe_intermediate_size > 0, r.field("moe_intermediate_size"), " must be > 0, got ",
               c.moe_intermediate_size);
  }
  if (any_dense)
    XMOE_CHECK(c.intermediate_size > 0, r.field("intermediate_size"), " must be > 0 (dense MLP layers), got ",
               c.intermediate_size);

  c.rms_norm_eps = r.get_positive("rms_norm_eps", 1e-6);
  c.max_position_embeddings = r.get_int("max_position_embeddings", 32768, 1, kMaxSize);
  c.tie_word_embeddings = r.get_bool("tie_word_embeddings", false);
  c.attention_bias = r.get_bool("attention_bias", false);

  // RoPE: v4 has rope_theta (+ rope_scaling) at the top level; v5 has rope_parameters holding rope_theta. A
  // non-null rope_scaling takes precedence over rope_parameters, as in transformers.
  c.rope_theta = r.get_positive("rope_theta", 10000.0);
  const char* rope_key = r.has("rope_scaling") ? "rope_scaling" : "rope_parameters";
  if (r.has(rope_key))
    c.rope_scaling = parse_rope(r.at(rope_key), where, rope_key, c.max_position_embeddings, c.rope_theta);

  if (auto bos = r.opt_int("bos_token_id", 0, kMaxInt)) c.bos_token_id = static_cast<int32_t>(*bos);
  if (r.has("eos_token_id")) {
    const json& e = r.at("eos_token_id");
    if (e.is_array()) {
      for (size_t i = 0; i < e.size(); ++i)
        c.eos_token_ids.push_back(static_cast<int32_t>(FieldReader::int_value(
            e[i], r.field("eos_token_id") + "[" + std::to_string(i) + "]", 0, kMaxInt)));
    } else {
      c.eos_token_ids.push_back(
          static_cast<int32_t>(FieldReader::int_value(e, r.field("eos_token_id"), 0, kMaxInt)));
    }
  }
  // v5 writes "dtype", v4 "torch_dtype".
  c.torch_dtype = r.opt_string("torch_dtype").value_or(r.opt_string("dtype").value_or(""));

  // Fields that change the computation in ways the Qwen3-MoE model does not implement.
  const std::string act = r.opt_string("hidden_act").value_or("silu");
  XMOE_CHECK(act == "silu", r.field("hidden_act"), " = '", act, "' is not supported (only 'silu')");
  XMOE_CHECK(!r.get_bool("use_sliding_window", false), r.field("use_sliding_window"),
             " = true is not supported (sliding-window attention)");
  return c;
}

ModelConfig parse_model_config(const std::string& config_json_path) {
  return parse_model_config_text(read_text_file(config_json_path), config_json_path);
}

}  // namespace xmoe::llm
