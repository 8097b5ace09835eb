#include "serve/adapter_common.hpp"

#include <chrono>
#include <cmath>
#include <random>

#include "serve/json_constraint.hpp"
#include "xmoe/error.hpp"

namespace xmoe::serve::adapter {

ApiError bad_request(const std::string& param, const std::string& message) {
  return ApiError(400, "invalid_request_error", message, param);
}

ojson parse_body(std::string_view body) {
  ojson j;
  try {
    j = ojson::parse(body);
  } catch (const nlohmann::json::exception& e) {
    throw bad_request("body", std::string("the request body is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) throw bad_request("body", "the request body must be a JSON object");
  return j;
}

std::string join_path(const std::string& path, const char* key) {
  return path.empty() ? key : path + "." + key;
}
std::string index_path(const std::string& path, size_t i) {
  return path + "[" + std::to_string(i) + "]";
}

const ojson* field(const ojson& object, const char* key) {
  if (!object.is_object()) return nullptr;
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<std::string> opt_string(const ojson& object, const char* key, const std::string& path) {
  const ojson* v = field(object, key);
  if (!v) return std::nullopt;
  if (!v->is_string()) throw bad_request(join_path(path, key), join_path(path, key) + " must be a string");
  return v->get<std::string>();
}

std::optional<double> opt_number(const ojson& object, const char* key, const std::string& path) {
  const ojson* v = field(object, key);
  if (!v) return std::nullopt;
  if (!v->is_number()) throw bad_request(join_path(path, key), join_path(path, key) + " must be a number");
  const double d = v->get<double>();
  if (!std::isfinite(d)) throw bad_request(join_path(path, key), join_path(path, key) + " must be finite");
  return d;
}

std::optional<int64_t> opt_integer(const ojson& object, const char* key, const std::string& path) {
  const ojson* v = field(object, key);
  if (!v) return std::nullopt;
  if (v->is_number_integer()) {
    if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      throw bad_request(join_path(path, key), join_path(path, key) + " is too large");
    return v->get<int64_t>();
  }
  // 5.0 is an integer to most clients.
  if (v->is_number_float()) {
    const double d = v->get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e15) return static_cast<int64_t>(d);
  }
  throw bad_request(join_path(path, key), join_path(path, key) + " must be an integer");
}

std::optional<bool> opt_bool(const ojson& object, const char* key, const std::string& path) {
  const ojson* v = field(object, key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) throw bad_request(join_path(path, key), join_path(path, key) + " must be a boolean");
  return v->get<bool>();
}

void read_sampling(const ojson& body, llm::SamplingParams& s) {
  auto range = [](const char* name, double v, double lo, double hi) {
    if (v < lo || v > hi)
      throw bad_request(name, std::string(name) + " must be in [" + ojson(lo).dump() + ", " +
                                  ojson(hi).dump() + "], got " + ojson(v).dump());
  };
  if (auto v = opt_number(body, "temperature", "")) range("temperature", *v, 0, 2), s.temperature = *v;
  if (auto v = opt_number(body, "top_p", "")) {
    if (*v <= 0 || *v > 1) throw bad_request("top_p", "top_p must be in (0, 1], got " + ojson(*v).dump());
    s.top_p = *v;
  }
  if (auto v = opt_integer(body, "top_k", "")) {
    if (*v < -1 || *v > INT32_MAX) throw bad_request("top_k", "top_k must be >= 0 (0 or -1 = off)");
    s.top_k = *v <= 0 ? 0 : static_cast<int>(*v);
  }
  if (auto v = opt_number(body, "min_p", "")) range("min_p", *v, 0, 1), s.min_p = *v;
  if (auto v = opt_number(body, "presence_penalty", ""))
    range("presence_penalty", *v, -2, 2), s.presence_penalty = *v;
  if (auto v = opt_number(body, "frequency_penalty", ""))
    range("frequency_penalty", *v, -2, 2), s.frequency_penalty = *v;
  if (auto v = opt_number(body, "repetition_penalty", "")) {
    if (*v <= 0) throw bad_request("repetition_penalty", "repetition_penalty must be > 0");
    s.repetition_penalty = *v;
  }
  if (const ojson* v = field(body, "seed")) {
    if (!v->is_number_integer()) throw bad_request("seed", "seed must be an integer");
    s.seed = v->is_number_unsigned() ? v->get<uint64_t>() : static_cast<uint64_t>(v->get<int64_t>());
  }
}

std::vector<std::string> read_stop(const ojson& body, const char* key) {
  std::vector<std::string> out;
  const ojson* v = field(body, key);
  if (!v) return out;
  if (v->is_string()) {
    if (!v->get<std::string>().empty()) out.push_back(v->get<std::string>());
    return out;
  }
  if (!v->is_array()) throw bad_request(key, std::string(key) + " must be a string or a list of strings");
  for (size_t i = 0; i < v->size(); ++i) {
    if (!(*v)[i].is_string()) throw bad_request(index_path(key, i), index_path(key, i) + " must be a string");
    if (!(*v)[i].get<std::string>().empty()) out.push_back((*v)[i].get<std::string>());
  }
  return out;
}

int read_choice_count(const ojson& body) {
  constexpr int kMaxChoices = 16;
  const auto n = opt_integer(body, "n", "");
  if (!n) return 1;
  if (*n < 1 || *n > kMaxChoices)
    throw bad_request("n", "n must be in [1, " + std::to_string(kMaxChoices) + "]");
  return static_cast<int>(*n);
}

ojson read_schema(const ojson& object, const char* key, const std::string& path) {
  const ojson* v = field(object, key);
  if (!v) return ojson::object();
  if (!v->is_object())
    throw bad_request(join_path(path, key), join_path(path, key) + " must be a JSON schema object");
  return *v;
}

int64_t resolve_max_tokens(const ModelInfo& info, const GenerationSettings& settings, int64_t prompt_tokens) {
  const int64_t room = info.max_seq_len - prompt_tokens;
  if (room < 1)
    throw bad_request("messages", "the prompt is " + std::to_string(prompt_tokens) +
                                      " tokens; this model's context (max_seq_len) is " +
                                      std::to_string(info.max_seq_len) +
                                      " tokens, prompt and output together");
  // A client asking for more than fits (Claude Code asks for 32000) gets what fits: the finish reason says
  // "length" if it runs out.
  const int64_t wanted = settings.max_tokens.value_or(room);
  return std::max<int64_t>(1, std::min(wanted, room));
}

namespace {

std::string json_quoted(const std::string& s) {
  return dump(ojson(s));
}

LogitsProcessor forced_json_processor(const ChatRequest& request, const ModelInfo& info, OutputFormat format,
                                      int64_t max_tokens) {
  const bool forced_tool = !request.tools.empty() && !forced_tool_names(request).empty();
  if (!forced_tool && !request.json_object) return nullptr;
  JsonConstraint c;
  c.max_tokens = max_tokens;
  c.end_tokens = info.chat ? info.chat->eos_token_ids : std::vector<int32_t>{};
  c.forbidden = {"<tool_call>", "</tool_call>", "<think>", "</think>"};
  if (forced_tool) {
    const std::vector<std::string> names = forced_tool_names(request);
    switch (format) {
      case OutputFormat::qwen3:
        if (names.size() > 1)
          for (const std::string& n : names)
            c.openings.push_back(json_quoted(n).substr(1) + ", \"arguments\": ");
        c.suffix = "}\n</tool_call>";
        break;
      case OutputFormat::deepseek_v3:
      case OutputFormat::kimi_k2:
        // One named call: the forced opening ends where its JSON arguments begin. The call's closing markers
        // are special tokens, which constrained text never holds, so the object is followed by the end of the
        // turn and the parser closes the call there.
        if (names.size() != 1) return nullptr;
        c.forbidden = format == OutputFormat::kimi_k2
                          ? std::vector<std::string>{"<|tool_call_end|>", "<|tool_calls_section_end|>"}
                          : std::vector<std::string>{"<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>"};
        break;
      default:
        // The other formats have no JSON grammar to force (or name the call inside it): the forced opening
        // alone.
        return nullptr;
    }
  }
  std::shared_ptr<const TokenTexts> texts = info.token_texts;
  if (!texts) texts = make_token_texts(*info.tokenizer);
  return make_json_logits_processor(std::move(texts), std::move(c));
}

}  // namespace

PreparedChat prepare_chat(const ChatRequest& request, Backend& backend) {
  const ModelInfo& info = backend.info();
  if (!info.tokenizer || !info.chat)
    throw bad_request("messages",
                      "the served model has no tokenizer and chat template; only /v1/completions "
                      "with token-id prompts works");
  PreparedChat p;
  try {
    p.prompt = render_chat_prompt(*info.chat, request, info.chat_template.get());
  } catch (const xmoe::Error& e) {
    throw bad_request("messages", std::string("the chat template refused the conversation: ") + e.what());
  }
  p.submit.prompt = info.tokenizer->encode(p.prompt.text, /*add_special_tokens=*/false);
  if (p.submit.prompt.empty()) throw bad_request("messages", "the conversation renders to an empty prompt");
  const int64_t max_tokens =
      resolve_max_tokens(info, request.generation, static_cast<int64_t>(p.submit.prompt.size()));
  p.submit.settings = request.generation;
  p.submit.settings.max_tokens = max_tokens;
  p.submit.max_tokens = max_tokens;
  p.submit.logits_processor = forced_json_processor(request, info, info.output_format, max_tokens);
  if (request.thinking_budget && request.enable_thinking.value_or(false) && p.prompt.forced_prefix.empty()) {
    if (auto close = info.tokenizer->token_to_id("</think>"))
      p.submit.logits_processor =
          chain_processors(std::move(p.submit.logits_processor),
                           make_thinking_budget_processor(*close, *request.thinking_budget));
  }
  p.parser.parse_tools = !request.tools.empty() && request.tool_choice != ToolChoice::none;
  // A forced JSON answer starts at the first token: there is no thinking to find in it.
  p.parser.parse_thinking = !(request.json_object && p.prompt.forced_prefix.empty());
  p.parser.starts_in_thinking = p.prompt.starts_in_thinking;
  p.parser.forced_prefix = p.prompt.forced_prefix;
  if (p.parser.parse_tools) p.parser.tools = request.tools;
  return p;
}

void apply_events(const std::vector<OutputEvent>& events, ChoiceOutput& out, const char* id_prefix) {
  for (const OutputEvent& e : events) {
    switch (e.kind) {
      case OutputEvent::Kind::text:
        out.text += e.text;
        break;
      case OutputEvent::Kind::thinking:
        out.reasoning += e.text;
        break;
      case OutputEvent::Kind::tool_call_begin:
        out.tool_calls.push_back(ToolCall{make_id(id_prefix), e.tool_name, ""});
        break;
      case OutputEvent::Kind::tool_call_arguments:
        if (!out.tool_calls.empty()) out.tool_calls.back().arguments += e.text;
        break;
      case OutputEvent::Kind::tool_call_end:
        break;
    }
  }
}

std::vector<ChoiceOutput> collect(GenerationStream& stream, int n, const OutputParserOptions& parser_options,
                                  OutputFormat format, const char* id_prefix) {
  std::vector<ChoiceOutput> out(n);
  std::vector<std::unique_ptr<OutputParser>> parsers;
  for (int i = 0; i < n; ++i) parsers.push_back(make_output_parser(format, parser_options));
  GenerationDelta d;
  std::vector<OutputEvent> events;
  while (stream.next(d)) {
    if (d.index < 0 || d.index >= n) continue;
    ChoiceOutput& c = out[d.index];
    c.tokens += static_cast<int64_t>(d.tokens.size());
    c.logprobs.insert(c.logprobs.end(), d.logprobs.begin(), d.logprobs.end());
    events.clear();
    parsers[d.index]->push(d.text, events);
    if (d.finish != llm::FinishReason::none) {
      parsers[d.index]->finish(events);
      c.finish = d.finish;
      c.stop_string = d.stop_string;
    }
    apply_events(events, c, id_prefix);
  }
  return out;
}

std::string make_id(std::string_view prefix) {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  std::random_device rd;
  std::mt19937_64 gen((static_cast<uint64_t>(rd()) << 32) ^ rd());
  std::string id(prefix);
  for (int i = 0; i < 24; ++i) id += kAlphabet[gen() % (sizeof(kAlphabet) - 1)];
  return id;
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string dump(const ojson& j) {
  return j.dump(-1, ' ', false, ojson::error_handler_t::replace);
}

std::string token_text(const Tokenizer& tokenizer, int32_t token) {
  const int32_t ids[1] = {token};
  return tokenizer.decode(ids);
}

}  // namespace xmoe::serve::adapter
