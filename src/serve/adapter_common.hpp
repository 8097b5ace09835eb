// What the OpenAI, Anthropic and /chat adapters share: reading request fields with errors that name them,
// turning a ChatRequest into a prompt and a SubmitRequest (template, tokens, budget, forced output), and
// folding a choice's generation deltas into parsed output.
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "serve/backend.hpp"
#include "serve/chat_request.hpp"
#include "serve/output_parser.hpp"

namespace xmoe::serve::adapter {

using ojson = nlohmann::ordered_json;

ApiError bad_request(const std::string& param, const std::string& message);

// The request body as a JSON object (400 "body" when it is not one).
ojson parse_body(std::string_view body);

// Typed field access: absent and null read as "not given"; a value of the wrong type is a 400 naming
// `path` (e.g. "messages[2].content").
const ojson* field(const ojson& object, const char* key);
std::optional<std::string> opt_string(const ojson& object, const char* key, const std::string& path);
std::optional<double> opt_number(const ojson& object, const char* key, const std::string& path);
std::optional<int64_t> opt_integer(const ojson& object, const char* key, const std::string& path);
std::optional<bool> opt_bool(const ojson& object, const char* key, const std::string& path);
std::string join_path(const std::string& path, const char* key);
std::string index_path(const std::string& path, size_t i);

// Sampling fields common to the APIs (temperature, top_p, top_k, min_p, seed, penalties), range-checked,
// applied over the server's defaults.
void read_sampling(const ojson& body, llm::SamplingParams& sampling);
// "stop" / "stop_sequences": a string or a list of strings.
std::vector<std::string> read_stop(const ojson& body, const char* key);
// A tool's JSON schema (parameters / input_schema): an object, {} when absent.
ojson read_schema(const ojson& object, const char* key, const std::string& path);

// A chat request made ready for the engine.
struct PreparedChat {
  RenderedPrompt prompt;
  SubmitRequest submit;
  OutputParserOptions parser;
};
// Renders the template (a template error is a 400: it is the conversation that the template refuses),
// tokenizes, fits max_tokens into the context (400 when the prompt alone fills it) and sets up forced JSON
// (tool_choice required/named, response_format json_object) and the thinking budget.
PreparedChat prepare_chat(const ChatRequest& request, Backend& backend);
// Fits a token budget into the context for a prompt of `prompt_tokens`.
int64_t resolve_max_tokens(const ModelInfo& info, const GenerationSettings& settings, int64_t prompt_tokens);

// One choice's output as the parser reads it.
struct ChoiceOutput {
  std::string text, reasoning;
  std::vector<ToolCall> tool_calls;
  std::vector<TokenLogprob> logprobs;
  int64_t tokens = 0;
  llm::FinishReason finish = llm::FinishReason::none;
  std::string stop_string;
};

// Applies parser events to a ChoiceOutput (ids for new calls from make_id).
void apply_events(const std::vector<OutputEvent>& events, ChoiceOutput& out, const char* id_prefix);

// Runs a stream to its end, parsing each choice's text (non-streaming responses).
std::vector<ChoiceOutput> collect(GenerationStream& stream, int n, const OutputParserOptions& parser,
                                  OutputFormat format, const char* id_prefix);

// A fresh identifier: prefix + 24 random letters and digits.
std::string make_id(std::string_view prefix);
int64_t unix_now();
std::string dump(const ojson& j);  // compact, invalid UTF-8 replaced

// The text of one token as a client sees it.
std::string token_text(const Tokenizer& tokenizer, int32_t token);

}  // namespace xmoe::serve::adapter
