#include "llm/quantization.hpp"

#include <fnmatch.h>
#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include "llm/tokenizer/regex.hpp"
#include "util/text_file.hpp"
#include "xmoe/error.hpp"

namespace xmoe::llm {

namespace {

using json = nlohmann::json;

json parse_json_file(const std::string& path) {
  try {
    return json::parse(read_text_file(path));
  } catch (const json::parse_error& e) {
    throw Error(path + ": malformed JSON at byte " + std::to_string(e.byte) + ": " + e.what());
  } catch (const json::exception& e) {  // e.g. a number too large for a double (found by fuzzing)
    throw Error(path + ": malformed JSON: " + e.what());
  }
}

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string string_field(const json& obj, const char* key, const std::string& where) {
  if (!obj.contains(key) || obj[key].is_null()) return "";
  XMOE_CHECK(obj[key].is_string(), where, ": field '", key, "' must be a string, got ", obj[key].dump());
  return obj[key].get<std::string>();
}

std::vector<std::string> string_list(const json& obj, const char* key, const std::string& where) {
  std::vector<std::string> out;
  if (!obj.contains(key) || obj[key].is_null()) return out;
  XMOE_CHECK(obj[key].is_array(), where, ": field '", key, "' must be a list of strings, got ",
             obj[key].dump());
  for (const json& v : obj[key]) {
    XMOE_CHECK(v.is_string(), where, ": field '", key, "' must be a list of strings, got ", obj[key].dump());
    out.push_back(v.get<std::string>());
  }
  return out;
}

// A "re:" module pattern as a whole-name match. Oniguruma rather than std::regex: a config's pattern must not
// overflow the stack while compiling (std::regex recurses per nesting level) nor backtrack without bound
// (Oniguruma's retry limit ends a runaway match with an error), and Python's re syntax is close to Ruby's.
tokenizer_detail::Regex module_regex(const std::string& pattern, const std::string& where) {
  return tokenizer_detail::Regex("\\A(?:" + pattern + ")\\z", where);
}

// The modules kept unquantized; "re:" patterns are compiled here, so a bad one is refused naming the field.
std::vector<std::string> module_list(const json& obj, const char* key, const std::string& where) {
  std::vector<std::string> out = string_list(obj, key, where);
  for (const std::string& p : out)
    if (p.rfind("re:", 0) == 0) module_regex(p.substr(3), where + ": field '" + key + "'");
  return out;
}

// DeepSeek FP8: quant_method "fp8", fmt e4m3, weight_block_size [128, 128].
void parse_fp8(const json& q, const std::string& where, QuantizationConfig& c) {
  c.scheme = QuantScheme::fp8_block;
  const std::string fmt = string_field(q, "fmt", where);
  XMOE_CHECK(fmt.empty() || fmt == "e4m3", where, ": field 'fmt' is '", fmt, "'; only e4m3 is supported");
  XMOE_CHECK(q.contains("weight_block_size"), where,
             ": field 'weight_block_size' is missing (FP8 block needs "
             "[128, 128])");
  const json& b = q["weight_block_size"];
  XMOE_CHECK(b == json::array({128, 128}), where, ": field 'weight_block_size' is ", b.dump(),
             "; FP8 block checkpoints use [128, 128]");
  const std::string act = string_field(q, "activation_scheme", where);
  XMOE_CHECK(act.empty() || act == "dynamic", where, ": field 'activation_scheme' is '", act,
             "'; only dynamic is supported (activations are computed in f32 here)");
  const std::string scale_fmt = string_field(q, "scale_fmt", where);
  XMOE_CHECK(scale_fmt.empty() || scale_fmt == "ue8m0", where, ": field 'scale_fmt' is '", scale_fmt,
             "'; only ue8m0 (or none) is known");
  c.ue8m0_scales = scale_fmt == "ue8m0";
  c.not_converted = module_list(q, "modules_to_not_convert", where);
}

// compressed-tensors: config_groups.*.format (or the top-level format) names the packing.
void parse_compressed_tensors(const json& q, const std::string& where, QuantizationConfig& c) {
  std::string format = string_field(q, "format", where);
  if (q.contains("config_groups") && q["config_groups"].is_object()) {
    for (const auto& [name, group] : q["config_groups"].items()) {
      const std::string gwhere = where + ".config_groups." + name;
      const std::string f = string_field(group, "format", gwhere);
      if (!f.empty()) {
        XMOE_CHECK(format.empty() || format == f || format == "mixed", gwhere, ": field 'format' is '", f,
                   "', but another group uses '", format, "' (one format per checkpoint is supported)");
        format = f;
      }
      if (group.contains("weights") && group["weights"].is_object()) {
        const json& w = group["weights"];
        if (w.contains("group_size") && w["group_size"].is_number_integer()) {
          const int64_t gs = w["group_size"].get<int64_t>();
          const int64_t want = format == "mxfp4-pack-quantized" ? 32 : 16;
          XMOE_CHECK(gs == want, gwhere, ".weights: field 'group_size' is ", gs, "; ", format, " uses ",
                     want);
        }
      }
    }
  }
  if (format == "nvfp4-pack-quantized")
    c.scheme = QuantScheme::nvfp4_compressed;
  else if (format == "mxfp4-pack-quantized")
    c.scheme = QuantScheme::mxfp4_compressed;
  else
    throw Error(where + ": field 'format' is '" + format +
                "'; supported compressed-tensors formats: nvfp4-pack-quantized, mxfp4-pack-quantized");
  c.not_converted = module_list(q, "ignore", where);
}

}  // namespace

const char* quant_scheme_name(QuantScheme s) {
  switch (s) {
    case QuantScheme::none:
      return "none";
    case QuantScheme::fp8_block:
      return "fp8 block";
    case QuantScheme::mxfp4:
      return "mxfp4";
    case QuantScheme::nvfp4_modelopt:
      return "nvfp4 (ModelOpt)";
    case QuantScheme::nvfp4_compressed:
      return "nvfp4 (compressed-tensors)";
    case QuantScheme::mxfp4_compressed:
      return "mxfp4 (compressed-tensors)";
  }
  return "?";
}

bool QuantizationConfig::is_not_converted(const std::string& module) const {
  for (const std::string& p : not_converted) {
    if (p.rfind("re:", 0) == 0) {
      if (!module_regex(p.substr(3), source + ": pattern '" + p + "'").find_all(module).empty()) return true;
    } else if (p.find_first_of("*?[") != std::string::npos) {
      if (::fnmatch(p.c_str(), module.c_str(), 0) == 0) return true;
    } else if (module == p ||
               (module.size() > p.size() && module.compare(module.size() - p.size(), p.size(), p) == 0 &&
                module[module.size() - p.size() - 1] == '.') ||
               module.rfind(p + ".", 0) == 0) {
      return true;  // the module itself, a dotted suffix of it ("lm_head", "mlp.gate") or a parent module
    }
  }
  return false;
}

QuantizationConfig parse_quantization_config(const std::string& dir) {
  QuantizationConfig c;
  const std::string config_path = dir + "/config.json";
  const json config = parse_json_file(config_path);
  if (config.is_object() && config.contains("quantization_config") &&
      !config["quantization_config"].is_null()) {
    const std::string where = config_path + ": quantization_config";
    const json& q = config["quantization_config"];
    XMOE_CHECK(q.is_object(), where, " must be an object, got ", q.dump());
    const std::string method = string_field(q, "quant_method", where);
    c.source = where;
    if (method == "fp8") {
      parse_fp8(q, where, c);
    } else if (method == "mxfp4") {
      c.scheme = QuantScheme::mxfp4;
      c.not_converted = module_list(q, "modules_to_not_convert", where);
    } else if (method == "compressed-tensors") {
      parse_compressed_tensors(q, where, c);
    } else if (method == "modelopt") {
      // transformers writes this stub next to hf_quant_config.json, which carries the details.
      XMOE_CHECK(
          file_exists(dir + "/hf_quant_config.json"), where,
          ": field 'quant_method' is 'modelopt', but hf_quant_config.json (which describes it) is missing");
    } else {
      throw Error(where + ": field 'quant_method' is '" + method +
                  "'; supported: fp8, mxfp4, compressed-tensors, modelopt (with hf_quant_config.json)");
    }
  }
  const std::string modelopt_path = dir + "/hf_quant_config.json";
  if (file_exists(modelopt_path)) {
    const json m = parse_json_file(modelopt_path);
    const std::string where = modelopt_path + ": quantization";
    XMOE_CHECK(m.is_object() && m.contains("quantization") && m["quantization"].is_object(), modelopt_path,
               ": field 'quantization' is missing");
    const json& q = m["quantization"];
    XMOE_CHECK(c.scheme == QuantScheme::none, modelopt_path, " and ", c.source,
               " both describe a quantization; keep one");
    const std::string algo = string_field(q, "quant_algo", where);
    XMOE_CHECK(algo == "NVFP4", where, ": field 'quant_algo' is '", algo, "'; supported: NVFP4");
    if (q.contains("group_size")) {
      XMOE_CHECK(q["group_size"] == 16, where, ": field 'group_size' is ", q["group_size"].dump(),
                 "; NVFP4 uses 16");
    }
    c.scheme = QuantScheme::nvfp4_modelopt;
    c.source = where;
    c.not_converted = module_list(q, "exclude_modules", where);
  }
  return c;
}

}  // namespace xmoe::llm
