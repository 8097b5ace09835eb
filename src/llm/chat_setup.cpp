#include "llm/chat_setup.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "util/text_file.hpp"
#include "xmoe/chat_template.hpp"
#include "xmoe/error.hpp"

namespace xmoe::llm {

namespace {

std::optional<std::string> read_optional_file(const std::filesystem::path& path) {
  if (!std::filesystem::exists(path)) return std::nullopt;
  return read_text_file(path.string());
}

std::optional<nlohmann::json> read_optional_json(const std::filesystem::path& path) {
  const std::optional<std::string> text = read_optional_file(path);
  if (!text) return std::nullopt;
  nlohmann::json j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  XMOE_CHECK(!j.is_discarded() && j.is_object(), path.string(), ": not a JSON object");
  return j;
}

// "eos_token": "<|im_end|>" or {"content": "<|im_end|>", ...} (older AddedToken dumps), or null.
std::string token_string(const nlohmann::json& config, const char* field, const std::string& where) {
  if (!config.contains(field) || config[field].is_null()) return {};
  const nlohmann::json& v = config[field];
  if (v.is_string()) return v.get<std::string>();
  XMOE_CHECK(v.is_object() && v.contains("content") && v["content"].is_string(), where, ": field \"", field,
             "\" must be a string or an object with a string \"content\"");
  return v["content"].get<std::string>();
}

std::vector<int32_t> eos_ids_of(const nlohmann::json& config, const std::string& where) {
  std::vector<int32_t> ids;
  if (!config.contains("eos_token_id") || config["eos_token_id"].is_null()) return ids;
  const nlohmann::json& v = config["eos_token_id"];
  const nlohmann::json list = v.is_array() ? v : nlohmann::json::array({v});
  for (const auto& id : list) {
    XMOE_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() <= INT32_MAX, where,
               ": field \"eos_token_id\" must be a non-negative integer or a list of them");
    ids.push_back(id.get<int32_t>());
  }
  return ids;
}

template <class T>
std::optional<T> number_field(const nlohmann::json& config, const char* field, const std::string& where) {
  if (!config.contains(field) || config[field].is_null()) return std::nullopt;
  XMOE_CHECK(config[field].is_number(), where, ": field \"", field, "\" must be a number");
  return config[field].get<T>();
}

void add_unique(std::vector<int32_t>& ids, int32_t id) {
  if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
}

}  // namespace

ChatSetup load_chat_setup(const std::string& dir, const ModelConfig& config, const Tokenizer* tokenizer) {
  const std::filesystem::path root(dir);
  ChatSetup setup;
  for (int32_t id : config.eos_token_ids) add_unique(setup.eos_token_ids, id);

  const std::string tok_config_path = (root / "tokenizer_config.json").string();
  if (const auto tok_config = read_optional_json(tok_config_path)) {
    setup.bos_token = token_string(*tok_config, "bos_token", tok_config_path);
    setup.eos_token = token_string(*tok_config, "eos_token", tok_config_path);
    if (tok_config->contains("chat_template") && !(*tok_config)["chat_template"].is_null()) {
      const nlohmann::json& t = (*tok_config)["chat_template"];
      if (t.is_string()) {
        setup.chat_template = t.get<std::string>();
      } else {
        XMOE_CHECK(t.is_array(), tok_config_path, ": field \"chat_template\" must be a string or a list");
        for (const auto& entry : t) {
          XMOE_CHECK(entry.is_object() && entry.contains("name") && entry["name"].is_string() &&
                         entry.contains("template") && entry["template"].is_string(),
                     tok_config_path,
                     ": each \"chat_template\" entry needs string \"name\" and \"template\"");
          if (entry["name"] == "default") setup.chat_template = entry["template"].get<std::string>();
        }
      }
      if (setup.chat_template) setup.chat_template_origin = tok_config_path;
    }
  }
  const std::filesystem::path jinja_path = root / "chat_template.jinja";
  if (auto source = read_optional_file(jinja_path)) {
    setup.chat_template = std::move(source);
    setup.chat_template_origin = jinja_path.string();
  }

  const std::string gen_path = (root / "generation_config.json").string();
  if (const auto gen = read_optional_json(gen_path)) {
    for (int32_t id : eos_ids_of(*gen, gen_path)) add_unique(setup.eos_token_ids, id);
    setup.temperature = number_field<double>(*gen, "temperature", gen_path);
    setup.top_p = number_field<double>(*gen, "top_p", gen_path);
    setup.min_p = number_field<double>(*gen, "min_p", gen_path);
    setup.repetition_penalty = number_field<double>(*gen, "repetition_penalty", gen_path);
    setup.top_k = number_field<int>(*gen, "top_k", gen_path);
    if (gen->contains("do_sample")) {
      XMOE_CHECK((*gen)["do_sample"].is_boolean(), gen_path, ": field \"do_sample\" must be true or false");
      if (!(*gen)["do_sample"].get<bool>()) setup.temperature = 0.0;
    }
  }
  if (tokenizer && !setup.eos_token.empty()) {
    if (const auto id = tokenizer->token_to_id(setup.eos_token)) add_unique(setup.eos_token_ids, *id);
  }
  return setup;
}

std::string render_chat_prompt(const ChatSetup& setup, const ChatPromptOptions& options) {
  XMOE_CHECK(setup.chat_template.has_value(),
             "chat: the checkpoint has no chat template (tokenizer_config.json \"chat_template\" or "
             "chat_template.jinja)");
  const ChatTemplate tmpl = ChatTemplate::parse(*setup.chat_template, setup.chat_template_origin);
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  if (options.system)
    messages.push_back(nlohmann::ordered_json{{"role", "system"}, {"content", *options.system}});
  messages.push_back(nlohmann::ordered_json{{"role", "user"}, {"content", options.user}});
  nlohmann::ordered_json context{{"messages", messages},
                                 {"add_generation_prompt", options.add_generation_prompt},
                                 {"bos_token", setup.bos_token},
                                 {"eos_token", setup.eos_token}};
  if (options.enable_thinking) context["enable_thinking"] = *options.enable_thinking;
  return tmpl.render_ordered(context);
}

void apply_generation_defaults(const ChatSetup& setup, SamplingParams& params) {
  if (setup.temperature) params.temperature = *setup.temperature;
  if (setup.top_p) params.top_p = *setup.top_p;
  if (setup.min_p) params.min_p = *setup.min_p;
  if (setup.repetition_penalty) params.repetition_penalty = *setup.repetition_penalty;
  if (setup.top_k) params.top_k = *setup.top_k;
}

namespace {

class TokenizerTextStream final : public TextStream {
 public:
  TokenizerTextStream(const Tokenizer& t, bool skip_special_tokens) : decoder_(t, skip_special_tokens) {}
  std::string push(int32_t token) override { return decoder_.push(token); }
  std::string flush() override { return decoder_.flush(); }

 private:
  Tokenizer::StreamDecoder decoder_;
};

}  // namespace

TextStreamFactory tokenizer_text_stream(const Tokenizer& tokenizer, bool skip_special_tokens) {
  return [&tokenizer, skip_special_tokens] {
    return std::make_unique<TokenizerTextStream>(tokenizer, skip_special_tokens);
  };
}

}  // namespace xmoe::llm
