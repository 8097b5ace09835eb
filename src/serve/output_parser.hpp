// Turns a model's generated text, as it streams, into API-neutral events: plain text, thinking, and tool
// calls whose arguments arrive in fragments. One parser per model family's output format; adding a family is
// one file plus a line in make_output_parser. (Contract between the protocol adapters and the runtime.)
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "llm/chat_setup.hpp"
#include "llm/model_config.hpp"
#include "serve/chat_request.hpp"

namespace xmoe::serve {

struct OutputEvent {
  enum class Kind {
    text,                 // text: visible answer text
    thinking,             // text: reasoning text
    tool_call_begin,      // tool_index, tool_name (tool_id is left empty: each API names calls its own way)
    tool_call_arguments,  // tool_index, text: the next fragment of the arguments' JSON text
    tool_call_end,        // tool_index; the fragments so far concatenate to the whole JSON object
  };
  Kind kind = Kind::text;
  std::string text;
  int tool_index = 0;
  std::string tool_id, tool_name;
};

struct OutputParserOptions {
  bool parse_tools = true;  // false for tool_choice none or a request without tools
  bool parse_thinking = true;
  bool starts_in_thinking = false;    // RenderedPrompt::starts_in_thinking
  std::string forced_prefix;          // RenderedPrompt::forced_prefix, consumed before the first push
  std::vector<ToolDefinition> tools;  // the offered tools: formats whose arguments are untyped text
                                      // (Qwen3-Coder's <parameter=…>) type the values by these schemas
};

class OutputParser {
 public:
  virtual ~OutputParser() = default;
  // Appends the events that `text` (the next piece of output) completes; text that may still turn out to be
  // markup (a partial "<tool_call>") is held back until it is decided.
  virtual void push(std::string_view text, std::vector<OutputEvent>& out) = 0;
  // End of output: releases what is held back (an unterminated tool call's text becomes plain text).
  virtual void finish(std::vector<OutputEvent>& out) = 0;
};

enum class OutputFormat { plain, qwen3, qwen3_coder, harmony, deepseek_v3, deepseek_v32, kimi_k2, glm4 };
const char* output_format_name(OutputFormat f);
// From the chat template (Qwen3-Coder's <function=…> tool calls, Qwen3's <tool_call> JSON, gpt-oss's harmony
// channels, DeepSeek's <｜tool▁calls▁begin｜> or DSML, Kimi's <|tool_calls_section_begin|>, GLM's
// <arg_key>), else plain.
OutputFormat detect_output_format(const llm::ChatSetup& setup, const llm::ModelConfig& config);
// The same from the chat template alone (what render_chat_prompt needs to open a forced tool call).
OutputFormat output_format_of_template(const llm::ChatSetup& setup);
std::unique_ptr<OutputParser> make_output_parser(OutputFormat format, const OutputParserOptions& options);
// Whether the format's markup is made of special tokens, which the engine's text stream must then keep
// (skip_special_tokens off): harmony's channels, DeepSeek's and Kimi's tool-call markers, GLM's <arg_key>.
bool output_format_uses_special_tokens(OutputFormat format);

}  // namespace xmoe::serve
