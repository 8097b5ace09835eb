// GLM-4.5 / 4.6 / 4.7 tool calls: <tool_call>NAME\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>\n…
// </tool_call> (GLM-4.7 writes no newlines). The template writes a string value as itself and any other value
// as JSON, so a value is a string where the tool's schema says string, else the JSON it is (a string when it
// is no JSON), as vLLM's GLM parser reads it. One arguments fragment per complete parameter.
#include <algorithm>

#include "serve/output_parsers.hpp"
#include "serve/tagged_output_parser.hpp"
#include "serve/tool_call_bodies.hpp"

namespace xmoe::serve {

namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

constexpr std::string_view kKeyOpen = "<arg_key>";
constexpr std::string_view kKeyClose = "</arg_key>";
constexpr std::string_view kValueOpen = "<arg_value>";
constexpr std::string_view kValueClose = "</arg_value>";

class Glm4ToolCallBody final : public ToolCallBodyParser {
 public:
  explicit Glm4ToolCallBody(std::shared_ptr<const std::vector<ToolDefinition>> tools)
      : tools_(std::move(tools)) {}

  void push(std::string_view text, int index, std::vector<OutputEvent>& out) override {
    body_ += text;
    if (!begun_ && !read_name(/*at_end=*/false, index, out)) return;
    for (;;) {
      if (!in_value_) {
        const size_t key_open = body_.find(kKeyOpen, pos_);
        if (key_open == std::string::npos) return;
        const size_t key_close = body_.find(kKeyClose, key_open);
        if (key_close == std::string::npos) return;
        const size_t value_open = body_.find(kValueOpen, key_close);
        if (value_open == std::string::npos) return;
        key_ = body_.substr(key_open + kKeyOpen.size(), key_close - key_open - kKeyOpen.size());
        pos_ = value_open + kValueOpen.size();
        in_value_ = true;
      }
      const size_t value_close = body_.find(kValueClose, pos_);
      if (value_close == std::string::npos) return;
      emit_param(body_.substr(pos_, value_close - pos_), index, out);
      pos_ = value_close + kValueClose.size();
    }
  }

  bool end(bool, int index, std::vector<OutputEvent>& out) override {
    if (!begun_ && !read_name(/*at_end=*/true, index, out)) return false;
    if (in_value_) emit_param(body_.substr(pos_), index, out);
    object_.close(index, out);
    append_event(out, OutputEvent::Kind::tool_call_end, "", index);
    return true;
  }

 private:
  // The name runs to the first newline or '<' (or to the end of the body at its end).
  bool read_name(bool at_end, int index, std::vector<OutputEvent>& out) {
    size_t b = 0;
    while (b < body_.size() && is_space(body_[b])) ++b;
    size_t e = body_.find_first_of("\n<", b);
    if (e == std::string::npos) {
      if (!at_end) return false;
      e = body_.size();
    }
    size_t name_end = e;
    while (name_end > b && is_space(body_[name_end - 1])) --name_end;
    // A name is one word; anything else between the markers is no call (given back as text).
    if (name_end == b ||
        std::find_if(body_.begin() + b, body_.begin() + name_end, is_space) != body_.begin() + name_end)
      return false;
    name_ = body_.substr(b, name_end - b);
    pos_ = e;
    begun_ = true;
    emit_tool_call_begin(name_, index, out);
    return true;
  }

  void emit_param(const std::string& value, int index, std::vector<OutputEvent>& out) {
    const bool as_string = schema_allows_string(parameter_schema(*tools_, name_, key_));
    object_.add(key_, argument_value_json(value, as_string), index, out);
    in_value_ = false;
  }

  std::shared_ptr<const std::vector<ToolDefinition>> tools_;
  std::string body_, name_, key_;
  size_t pos_ = 0;
  bool begun_ = false, in_value_ = false;
  ArgumentObjectWriter object_;
};

}  // namespace

std::unique_ptr<OutputParser> make_glm4_output_parser(const OutputParserOptions& options) {
  auto tools = std::make_shared<const std::vector<ToolDefinition>>(options.tools);
  return std::make_unique<TaggedOutputParser>(options,
                                              [tools] { return std::make_unique<Glm4ToolCallBody>(tools); });
}

}  // namespace xmoe::serve
