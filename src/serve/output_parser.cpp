#include "serve/output_parser.hpp"

#include "serve/output_parsers.hpp"

namespace xmoe::serve {

namespace {

// A model with no thinking or tool-call markup: its output is the answer.
class PlainOutputParser final : public OutputParser {
 public:
  void push(std::string_view text, std::vector<OutputEvent>& out) override {
    if (text.empty()) return;
    OutputEvent e;
    e.text = std::string(text);
    out.push_back(std::move(e));
  }
  void finish(std::vector<OutputEvent>&) override {}
};

}  // namespace

std::unique_ptr<OutputParser> make_plain_output_parser(const OutputParserOptions&) {
  return std::make_unique<PlainOutputParser>();
}

std::unique_ptr<OutputParser> make_output_parser(OutputFormat format, const OutputParserOptions& options) {
  switch (format) {
    case OutputFormat::qwen3:
      return make_qwen3_output_parser(options);
    case OutputFormat::qwen3_coder:
      return make_qwen3_coder_output_parser(options);
    case OutputFormat::harmony:
      return make_harmony_output_parser(options);
    case OutputFormat::deepseek_v3:
      return make_deepseek_v3_output_parser(options);
    case OutputFormat::deepseek_v32:
      return make_deepseek_v32_output_parser(options);
    case OutputFormat::kimi_k2:
      return make_kimi_k2_output_parser(options);
    case OutputFormat::glm4:
      return make_glm4_output_parser(options);
    case OutputFormat::plain:
      break;
  }
  return make_plain_output_parser(options);
}

}  // namespace xmoe::serve
