// Kimi-K2's tool calls: <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX
// <|tool_call_argument_begin|>{ARGS}<|tool_call_end|>…<|tool_calls_section_end|> (the call id's "functions."
// namespace and ":IDX" counter are dropped from the name; arguments stream out as the model writes them).
// Kimi-K2-Thinking writes <think>…</think> first.
#include <optional>

#include "serve/output_parsers.hpp"
#include "serve/tagged_output_parser.hpp"
#include "serve/tool_call_bodies.hpp"

namespace xmoe::serve {

namespace {

// "functions.get_weather:0" → "get_weather".
std::string name_of_call_id(std::string_view id) {
  id = trim_json_space(id);
  if (id.starts_with("functions.")) id.remove_prefix(10);
  const size_t colon = id.rfind(':');
  if (colon != std::string_view::npos && colon + 1 < id.size() &&
      id.find_first_not_of("0123456789", colon + 1) == std::string_view::npos)
    id = id.substr(0, colon);
  return std::string(id);
}

class KimiK2ToolCallBody final : public ToolCallBodyParser {
 public:
  void push(std::string_view text, int index, std::vector<OutputEvent>& out) override {
    if (args_) {
      args_->push(text, index, out);
      return;
    }
    head_ += text;
    const size_t sep = sep_search_.find(head_, kArgumentBegin, 0);
    if (sep == std::string::npos) return;
    const std::string name = name_of_call_id(std::string_view(head_).substr(0, sep));
    if (name.empty()) return;
    args_.emplace(name);
    args_->push(std::string_view(head_).substr(sep + kArgumentBegin.size()), index, out);
  }

  bool end(bool, int index, std::vector<OutputEvent>& out) override {
    return args_ && args_->end(index, out);
  }

 private:
  static constexpr std::string_view kArgumentBegin = "<|tool_call_argument_begin|>";
  std::string head_;
  MarkerSearch sep_search_;
  std::optional<JsonArgumentsStream> args_;
};

}  // namespace

std::unique_ptr<OutputParser> make_kimi_k2_output_parser(const OutputParserOptions& options) {
  TaggedMarkup markup;
  markup.call_open = "<|tool_call_begin|>";
  markup.call_close = "<|tool_call_end|>";
  markup.call_group_markers = {"<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"};
  return std::make_unique<TaggedOutputParser>(
      options, [] { return std::make_unique<KimiK2ToolCallBody>(); }, markup);
}

}  // namespace xmoe::serve
