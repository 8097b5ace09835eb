// One API-neutral chat request: what the OpenAI and Anthropic adapters parse their bodies into, and what the
// chat template renders into a prompt. (Contract between the protocol adapters and the serving runtime.)
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "llm/chat_setup.hpp"
#include "llm/sampler.hpp"
#include "xmoe/chat_template.hpp"

namespace xmoe::serve {

struct ToolCall {
  std::string id;  // "call_…" (OpenAI) / "toolu_…" (Anthropic)
  std::string name;
  std::string arguments;  // a JSON object as text
};

enum class Role { system, user, assistant, tool };  // OpenAI "developer" maps to system

struct ChatMessage {
  Role role = Role::user;
  std::string content;               // text (content parts / text blocks joined)
  std::string reasoning;             // assistant thinking (reasoning_content / thinking blocks)
  std::vector<ToolCall> tool_calls;  // assistant
  std::string tool_call_id;          // tool result: the call it answers
  std::string tool_name;             // tool result: the function's name when known
};

struct ToolDefinition {
  std::string name, description;
  nlohmann::ordered_json parameters = nlohmann::ordered_json::object();  // JSON schema
};

enum class ToolChoice { automatic, none, required, named };

// What the engine is asked to do; fields not set by the request keep the server's defaults
// (generation_config.json), which the adapters receive and start from.
struct GenerationSettings {
  std::optional<int64_t> max_tokens;  // absent: up to the context limit
  llm::SamplingParams sampling;
  std::vector<std::string> stop;
  int n = 1;  // choices (OpenAI)
  bool logprobs = false;
  int top_logprobs = 0;  // 0..20
  bool ignore_eos = false;
};

struct ChatRequest {
  std::string model;  // as the client sent it (echoed back)
  std::vector<ChatMessage> messages;
  std::vector<ToolDefinition> tools;
  ToolChoice tool_choice = ToolChoice::automatic;
  std::string tool_choice_name;            // ToolChoice::named
  std::optional<bool> enable_thinking;     // absent: the template's default
  std::optional<int64_t> thinking_budget;  // Anthropic thinking.budget_tokens
  nlohmann::ordered_json chat_template_kwargs = nlohmann::ordered_json::object();
  bool json_object = false;  // response_format {"type": "json_object"}
  GenerationSettings generation;
  bool stream = false;
  bool include_usage = false;  // OpenAI stream_options.include_usage
};

// The prompt text for a request: the chat template over messages and tools (HF conventions: assistant
// "tool_calls" as [{"type": "function", "id", "function": {"name", "arguments": object}}], tool messages
// with "tool_call_id"; tools as [{"type": "function", "function": {...}}]; add_generation_prompt; the
// request's enable_thinking and chat_template_kwargs), followed by what the server forces the assistant to
// begin with (forced_prefix, e.g. the opening of a tool call for tool_choice required/named).
struct RenderedPrompt {
  std::string text;                 // template output + forced_prefix
  std::string forced_prefix;        // already part of text; the output parser starts as if it had read it
  bool starts_in_thinking = false;  // the prompt leaves the assistant inside a thinking block
};
// `parsed` is setup's template parsed once for the model (parse_chat_template); without it the template is
// parsed for this request.
RenderedPrompt render_chat_prompt(const llm::ChatSetup& setup, const ChatRequest& request,
                                  const ChatTemplate* parsed = nullptr);
// setup's chat template parsed, for every request to the model to render with; null when there is none or it
// does not parse (each request then reports the parse error, and endpoints that need no template still work).
std::shared_ptr<const ChatTemplate> parse_chat_template(const llm::ChatSetup& setup);
// Whether a rendered prompt leaves the assistant inside a thinking block: it ends, white space aside, with
// "<think>" (GLM-4.7, DeepSeek-V3.1 thinking, Qwen3 thinking models). The output parser must then read the
// reply as reasoning until "</think>" (OutputParserOptions::starts_in_thinking).
bool prompt_opens_thinking(std::string_view prompt);

// The tools a call is forced to (tool_choice named: that one; required: every offered tool; else none).
std::vector<std::string> forced_tool_names(const ChatRequest& request);

}  // namespace xmoe::serve
