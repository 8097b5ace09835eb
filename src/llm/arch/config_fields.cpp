#include "llm/arch/config_fields.hpp"

#include <algorithm>
#include <cmath>

#include "xmoe/error.hpp"

namespace xmoe::llm {

using json = nlohmann::json;

const char* json_type_name(const json& v) {
  if (v.is_number_integer()) return "integer";
  if (v.is_number_float()) return "number";
  return v.type_name();
}

std::optional<int64_t> FieldReader::opt_int(const char* key, int64_t lo, int64_t hi) const {
  if (!has(key)) return std::nullopt;
  return int_value(obj_.at(key), field(key), lo, hi);
}

std::optional<double> FieldReader::opt_number(const char* key) const {
  if (!has(key)) return std::nullopt;
  const json& v = obj_.at(key);
  XMOE_CHECK(v.is_number(), field(key), " must be a number, got ", json_type_name(v), " ", v.dump());
  const double d = v.get<double>();
  XMOE_CHECK(std::isfinite(d), field(key), " must be finite, got ", v.dump());
  return d;
}

double FieldReader::get_positive(const char* key, double def) const {
  const double d = opt_number(key).value_or(def);
  XMOE_CHECK(d > 0, field(key), " must be > 0, got ", d);
  return d;
}

bool FieldReader::get_bool(const char* key, bool def) const {
  if (!has(key)) return def;
  const json& v = obj_.at(key);
  XMOE_CHECK(v.is_boolean(), field(key), " must be true or false, got ", json_type_name(v), " ", v.dump());
  return v.get<bool>();
}

std::optional<std::string> FieldReader::opt_string(const char* key) const {
  if (!has(key)) return std::nullopt;
  const json& v = obj_.at(key);
  XMOE_CHECK(v.is_string(), field(key), " must be a string, got ", json_type_name(v), " ", v.dump());
  return v.get<std::string>();
}

int64_t FieldReader::int_value(const json& v, const std::string& what, int64_t lo, int64_t hi) {
  XMOE_CHECK(v.is_number_integer(), what, " must be an integer, got ", json_type_name(v), " ", v.dump());
  XMOE_CHECK(!v.is_number_unsigned() || v.get<uint64_t>() <= static_cast<uint64_t>(hi), what, " must be in [",
             lo, ", ", hi, "], got ", v.dump());
  const int64_t i = v.get<int64_t>();
  XMOE_CHECK(i >= lo && i <= hi, what, " must be in [", lo, ", ", hi, "], got ", i);
  return i;
}

namespace {

// The RoPE types RopeScaling can describe; longrope needs per-dimension factor lists it has no room for.
bool known_rope_type(const std::string& t) {
  return t == "default" || t == "linear" || t == "dynamic" || t == "yarn" || t == "llama3";
}

// rope_scaling (transformers v4) or rope_parameters (v5, which also holds rope_theta and may hold
// partial_rotary_factor). Returns the scaling (nullopt for "default"); updates rope_theta and
// partial_rotary_factor from the dict when it has them.
std::optional<RopeScaling> parse_rope(const json& rope, const std::string& where, const std::string& key,
                                      int64_t max_position_embeddings, double& rope_theta,
                                      double& partial_rotary_factor) {
  XMOE_CHECK(rope.is_object(), where, ": field '", key, "' must be an object or null, got ",
             json_type_name(rope), " ", rope.dump());
  for (const auto& [k, v] : rope.items())
    XMOE_CHECK(!v.is_object(), where, ": field '", key, ".", k,
               "': per-layer-type RoPE parameters are not supported");
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
  if (auto prf = r.opt_number("partial_rotary_factor")) {
    XMOE_CHECK(*prf > 0 && *prf <= 1, r.field("partial_rotary_factor"), " must be in (0, 1], got ", *prf);
    partial_rotary_factor = *prf;
  }
  if (type == "default") return std::nullopt;

  RopeScaling s;
  s.type = type;
  s.source = key;
  // yarn may omit factor and derive it from the two context lengths, as transformers does.
  const std::optional<int64_t> original = r.opt_int("original_max_position_embeddings", 1, kMaxConfigSize);
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
    s.truncate = r.get_bool("truncate", true);
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

std::vector<int32_t> token_ids(const FieldReader& r, const char* key) {
  std::vector<int32_t> ids;
  if (!r.has(key)) return ids;
  const json& e = r.at(key);
  if (e.is_array()) {
    for (size_t i = 0; i < e.size(); ++i)
      ids.push_back(static_cast<int32_t>(
          FieldReader::int_value(e[i], r.field(key) + "[" + std::to_string(i) + "]", 0, kMaxConfigInt)));
  } else {
    ids.push_back(static_cast<int32_t>(FieldReader::int_value(e, r.field(key), 0, kMaxConfigInt)));
  }
  return ids;
}

}  // namespace

void parse_decoder_fields(const FieldReader& r, const DecoderDefaults& d, ModelConfig& c) {
  c.vocab_size = r.get_int("vocab_size", d.vocab_size, 1, kMaxConfigInt);
  c.hidden_size = r.get_int("hidden_size", d.hidden_size, 1, kMaxConfigSize);
  c.intermediate_size = r.get_int("intermediate_size", d.intermediate_size, 0, kMaxConfigSize);
  c.moe_intermediate_size = r.get_int("moe_intermediate_size", d.moe_intermediate_size, 0, kMaxConfigSize);
  c.num_hidden_layers =
      static_cast<int>(r.get_int("num_hidden_layers", d.num_hidden_layers, 1, kMaxConfigInt));
  c.num_attention_heads =
      static_cast<int>(r.get_int("num_attention_heads", d.num_attention_heads, 1, kMaxConfigInt));
  c.num_key_value_heads =
      static_cast<int>(r.get_int("num_key_value_heads", d.num_key_value_heads, 1, kMaxConfigInt));
  XMOE_CHECK(c.num_attention_heads % c.num_key_value_heads == 0, r.field("num_key_value_heads"), " = ",
             c.num_key_value_heads, " must divide num_attention_heads = ", c.num_attention_heads);
  if (r.has("head_dim")) {
    c.head_dim = static_cast<int>(r.get_int("head_dim", 0, 1, kMaxConfigInt));
  } else {
    XMOE_CHECK(c.hidden_size >= c.num_attention_heads, r.field("hidden_size"), " = ", c.hidden_size,
               " is smaller than num_attention_heads = ", c.num_attention_heads,
               " and there is no head_dim to use instead");
    c.head_dim = static_cast<int>(c.hidden_size / c.num_attention_heads);
  }
  XMOE_CHECK(c.head_dim % 2 == 0, r.has("head_dim") ? r.field("head_dim") : r.field("hidden_size"),
             ": head_dim ", c.head_dim, " must be even (RoPE rotates pairs)");

  c.rms_norm_eps = r.get_positive("rms_norm_eps", d.rms_norm_eps);
  c.max_position_embeddings =
      r.get_int("max_position_embeddings", d.max_position_embeddings, 1, kMaxConfigSize);
  c.tie_word_embeddings = r.get_bool("tie_word_embeddings", d.tie_word_embeddings);
  c.attention_bias = r.get_bool("attention_bias", d.attention_bias);

  // RoPE: v4 has rope_theta (+ rope_scaling, + partial_rotary_factor) at the top level; v5 has
  // rope_parameters holding them. A non-null rope_scaling takes precedence over rope_parameters, as in
  // transformers.
  c.rope_theta = r.get_positive("rope_theta", d.rope_theta);
  if (auto prf = r.opt_number("partial_rotary_factor")) {
    XMOE_CHECK(*prf > 0 && *prf <= 1, r.field("partial_rotary_factor"), " must be in (0, 1], got ", *prf);
    c.partial_rotary_factor = *prf;
  }
  const char* rope_key = r.has("rope_scaling") ? "rope_scaling" : "rope_parameters";
  if (r.has(rope_key))
    c.rope_scaling = parse_rope(r.at(rope_key), r.where(), rope_key, c.max_position_embeddings, c.rope_theta,
                                c.partial_rotary_factor);
  // transformers: dim = int(head_dim * partial_rotary_factor).
  c.rotary_dim = static_cast<int>(static_cast<double>(c.head_dim) * c.partial_rotary_factor);
  XMOE_CHECK(c.rotary_dim >= 2 && c.rotary_dim % 2 == 0, r.field("partial_rotary_factor"), " = ",
             c.partial_rotary_factor, " gives a rotary dimension of ", c.rotary_dim, " (head_dim ",
             c.head_dim, "); it must be even and >= 2");

  if (auto bos = r.opt_int("bos_token_id", 0, kMaxConfigInt)) c.bos_token_id = static_cast<int32_t>(*bos);
  c.eos_token_ids = token_ids(r, "eos_token_id");
  // v5 writes "dtype", v4 "torch_dtype".
  c.torch_dtype = r.opt_string("torch_dtype").value_or(r.opt_string("dtype").value_or(""));
}

void parse_moe_fields(const FieldReader& r, const DecoderDefaults& d, ModelConfig& c) {
  // transformers v5 writes num_experts under its attribute_map name num_local_experts.
  const char* experts_key = r.has("num_experts") ? "num_experts" : "num_local_experts";
  c.num_experts = static_cast<int>(r.get_int(experts_key, d.num_experts, 0, kMaxConfigInt));
  c.num_experts_per_tok =
      static_cast<int>(r.get_int("num_experts_per_tok", d.num_experts_per_tok, 1, kMaxConfigInt));
  c.norm_topk_prob = r.get_bool("norm_topk_prob", c.norm_topk_prob);
  c.decoder_sparse_step = static_cast<int>(r.get_int("decoder_sparse_step", 1, 1, kMaxConfigInt));
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
}

void parse_layer_types(const FieldReader& r, ModelConfig& c) {
  if (auto w = r.opt_int("sliding_window", 0, kMaxConfigSize)) c.sliding_window = *w;
  c.layer_types.assign(static_cast<size_t>(c.num_hidden_layers), AttentionKind::full);
  if (!r.has("layer_types")) return;
  const json& t = r.at("layer_types");
  XMOE_CHECK(t.is_array(), r.field("layer_types"), " must be a list of strings, got ", t.dump());
  XMOE_CHECK(t.size() == static_cast<size_t>(c.num_hidden_layers), r.field("layer_types"), " has ", t.size(),
             " entries but num_hidden_layers = ", c.num_hidden_layers);
  for (size_t i = 0; i < t.size(); ++i) {
    const std::string what = r.field("layer_types") + "[" + std::to_string(i) + "]";
    XMOE_CHECK(t[i].is_string(), what, " must be a string, got ", t[i].dump());
    const std::string kind = t[i].get<std::string>();
    if (kind == "full_attention") continue;
    XMOE_CHECK(kind == "sliding_attention", what, " = '", kind,
               "' is not supported (expected full_attention or sliding_attention)");
    XMOE_CHECK(c.sliding_window >= 1, r.field("sliding_window"), " must be >= 1 when ", what,
               " is sliding_attention, got ", c.sliding_window);
    c.layer_types[i] = AttentionKind::sliding;
  }
}

}  // namespace xmoe::llm
