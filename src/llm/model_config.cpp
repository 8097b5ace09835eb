#include "llm/model_config.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "llm/arch/architecture.hpp"
#include "llm/arch/config_fields.hpp"
#include "util/text_file.hpp"

namespace xmoe::llm {

bool ModelConfig::is_sparse_layer(int i) const {
  if (num_experts <= 0) return false;
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), i) != mlp_only_layers.end()) return false;
  return (i + 1) % decoder_sparse_step == 0;
}

int64_t ModelConfig::attention_window(int i) const {
  if (i < 0 || static_cast<size_t>(i) >= layer_types.size()) return 0;
  return layer_types[static_cast<size_t>(i)] == AttentionKind::sliding ? sliding_window : 0;
}

ModelConfig parse_model_config_text(const std::string& json_text, const std::string& where) {
  using json = nlohmann::json;
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::parse_error& e) {
    throw Error(where + ": malformed JSON at byte " + std::to_string(e.byte) + ": " + e.what());
  } catch (const json::exception& e) {
    throw Error(where + ": malformed JSON: " + e.what());
  }
  XMOE_CHECK(j.is_object(), where, ": must hold a JSON object, got ", json_type_name(j));
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
  XMOE_CHECK(!c.architecture.empty() || !c.model_type.empty(), where,
             ": field 'architectures' is missing (and no 'model_type' either); supported: ",
             supported_architecture_names());
  const Architecture* arch = c.architecture.empty() ? find_architecture_by_model_type(c.model_type)
                                                    : find_architecture(c.architecture);
  XMOE_CHECK(arch != nullptr, c.architecture.empty() ? r.field("model_type") : r.field("architectures"),
             ": unknown architecture '", c.architecture.empty() ? c.model_type : c.architecture,
             "' (supported: ", supported_architecture_names(), ")");
  c.architecture = std::string(arch->name());
  if (c.model_type.empty()) c.model_type = std::string(arch->model_type());
  XMOE_CHECK(arch->has_model_type(c.model_type), r.field("model_type"), " is '", c.model_type,
             "' but architecture ", arch->name(), " needs '", arch->model_type(), "'");
  arch->parse_config(r, c);
  if (c.layer_types.empty())
    c.layer_types.assign(static_cast<size_t>(c.num_hidden_layers), AttentionKind::full);
  return c;
}

ModelConfig parse_model_config(const std::string& config_json_path) {
  return parse_model_config_text(read_text_file(config_json_path), config_json_path);
}

}  // namespace xmoe::llm
