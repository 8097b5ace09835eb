#include "serve/output_parser.hpp"

namespace xmoe::serve {

const char* output_format_name(OutputFormat f) {
  switch (f) {
    case OutputFormat::plain:
      return "plain";
    case OutputFormat::qwen3:
      return "qwen3";
    case OutputFormat::qwen3_coder:
      return "qwen3_coder";
    case OutputFormat::harmony:
      return "harmony";
  }
  return "?";
}

// The template says how the model was taught to call tools: Qwen3-Coder's templates render calls as
// <function=name><parameter=p>…, Qwen3's as <tool_call>{json}</tool_call>, gpt-oss's as harmony messages
// (<|channel|>commentary to=functions.name …).
OutputFormat detect_output_format(const llm::ChatSetup& setup, const llm::ModelConfig&) {
  return output_format_of_template(setup);
}

OutputFormat output_format_of_template(const llm::ChatSetup& setup) {
  if (!setup.chat_template) return OutputFormat::plain;
  const std::string& t = *setup.chat_template;
  if (t.find("<|channel|>") != std::string::npos) return OutputFormat::harmony;
  if (t.find("<function=") != std::string::npos) return OutputFormat::qwen3_coder;
  if (t.find("<tool_call>") != std::string::npos || t.find("<think>") != std::string::npos)
    return OutputFormat::qwen3;
  return OutputFormat::plain;
}

}  // namespace xmoe::serve
