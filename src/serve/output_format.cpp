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
    case OutputFormat::deepseek_v3:
      return "deepseek_v3";
    case OutputFormat::deepseek_v32:
      return "deepseek_v32";
    case OutputFormat::kimi_k2:
      return "kimi_k2";
    case OutputFormat::glm4:
      return "glm4";
  }
  return "?";
}

bool output_format_uses_special_tokens(OutputFormat f) {
  switch (f) {
    case OutputFormat::harmony:
    case OutputFormat::deepseek_v3:
    case OutputFormat::deepseek_v32:
    case OutputFormat::kimi_k2:
    case OutputFormat::glm4:
      return true;
    case OutputFormat::plain:
    case OutputFormat::qwen3:
    case OutputFormat::qwen3_coder:
      break;
  }
  return false;
}

// The template says how the model was taught to call tools: Qwen3-Coder's templates render calls as
// <function=name><parameter=p>…, Qwen3's as <tool_call>{json}</tool_call>, gpt-oss's as harmony messages
// (<|channel|>commentary to=functions.name …). The families that also write <tool_call> or <think> are told
// apart first.
OutputFormat detect_output_format(const llm::ChatSetup& setup, const llm::ModelConfig&) {
  return output_format_of_template(setup);
}

OutputFormat output_format_of_template(const llm::ChatSetup& setup) {
  if (!setup.chat_template) return OutputFormat::plain;
  const std::string& t = *setup.chat_template;
  const auto has = [&t](std::string_view s) { return t.find(s) != std::string::npos; };
  if (has("<|channel|>")) return OutputFormat::harmony;
  if (has("<｜tool▁calls▁begin｜>")) return OutputFormat::deepseek_v3;
  if (has("｜DSML｜")) return OutputFormat::deepseek_v32;
  if (has("<|tool_calls_section_begin|>")) return OutputFormat::kimi_k2;
  if (has("<arg_key>")) return OutputFormat::glm4;
  if (t.find("<function=") != std::string::npos) return OutputFormat::qwen3_coder;
  if (t.find("<tool_call>") != std::string::npos || t.find("<think>") != std::string::npos)
    return OutputFormat::qwen3;
  return OutputFormat::plain;
}

}  // namespace xmoe::serve
