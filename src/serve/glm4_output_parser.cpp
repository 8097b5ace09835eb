// GLM-4.5 / 4.6 / 4.7 tool calls: <tool_call>NAME\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>\n…
// </tool_call> (GLM-4.7 writes no newlines). The template writes a string value as itself and any other value
// as JSON, so a value is a string where the tool's schema says string, else the JSON it is (a string when it
// is no JSON), as vLLM's GLM parser reads it. One arguments fragment per complete parameter.
#include "serve/output_parsers.hpp"
#include "serve/tagged_output_parser.hpp"
#include "serve/tool_call_bodies.hpp"

namespace xmoe::serve {

namespace {

constexpr std::string_view kKeyOpen = "<arg_key>";
constexpr std::string_view kKeyClose = "</arg_key>";
constexpr std::string_view kValueOpen = "<arg_value>";
constexpr std::string_view kValueClose = "</arg_value>";

class Glm4ToolCallBody final : public ToolCallBodyParser {
 public:
  explicit Glm4ToolCallBody(std::shared_ptr<const std::vector<ToolDefinition>> tools)
      : tools_(std::move(tools)) {}

  void push(std::string_view text, int index, std::vector<OutputEvent>& out) override {
    if (no_call_) return;
    body_ += text;
    if (!begun_ && !read_name(/*at_end=*/false, index, out)) return;
    for (;;) {
      if (!in_value_) {
        const size_t key_open = key_search_.find(body_, kKeyOpen, pos_);
        if (key_open == std::string::npos) return;
        const size_t key_close = body_.find(kKeyClose, key_open);
        if (key_close == std::string::npos) return;
        const size_t value_open = body_.find(kValueOpen, key_close);
        if (value_open == std::string::npos) return;
        key_ = body_.substr(key_open + kKeyOpen.size(), key_close - key_open - kKeyOpen.size());
        pos_ = value_open + kValueOpen.size();
        in_value_ = true;
      }
      const size_t value_close = value_search_.find(body_, kValueClose, pos_);
      if (value_close == std::string::npos) return;
      emit_param(body_.substr(pos_, value_close - pos_), index, out);
      pos_ = value_close + kValueClose.size();
    }
  }

  bool end(bool, int index, std::vector<OutputEvent>& out) override {
    if (no_call_ || (!begun_ && !read_name(/*at_end=*/true, index, out))) return false;
    if (in_value_) emit_param(body_.substr(pos_), index, out);
    object_.close(index, out);
    append_event(out, OutputEvent::Kind::tool_call_end, "", index);
    return true;
  }

 private:
  // The name is one word, ended by a newline or '<' (or by the end of the body at its end); anything else
  // between the markers is no call (given back as text). Read a byte at a time, each byte once.
  bool read_name(bool at_end, int index, std::vector<OutputEvent>& out) {
    for (; scan_ < body_.size(); ++scan_) {
      const char c = body_[scan_];
      const bool ends_name = c == '\n' || c == '<';
      if (name_state_ == NameState::leading) {
        if (is_json_space(c)) continue;
        if (c == '<') return give_up();
        name_begin_ = scan_;
        name_state_ = NameState::in_name;
      } else if (name_state_ == NameState::in_name) {
        if (ends_name) return begin_call(scan_, scan_, index, out);
        if (is_json_space(c)) {
          name_end_ = scan_;
          name_state_ = NameState::after_name;
        }
      } else {  // after_name: only spaces until the newline or '<'
        if (ends_name) return begin_call(name_end_, scan_, index, out);
        if (!is_json_space(c)) return give_up();
      }
    }
    if (!at_end || name_state_ == NameState::leading) return false;
    return begin_call(name_state_ == NameState::in_name ? body_.size() : name_end_, body_.size(), index, out);
  }

  bool begin_call(size_t name_end, size_t resume, int index, std::vector<OutputEvent>& out) {
    name_ = body_.substr(name_begin_, name_end - name_begin_);
    pos_ = resume;
    begun_ = true;
    emit_tool_call_begin(name_, index, out);
    return true;
  }

  bool give_up() {
    no_call_ = true;
    return false;
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
  bool no_call_ = false;  // the body has shown it is no call: it is given back as text at its end
  enum class NameState { leading, in_name, after_name };
  NameState name_state_ = NameState::leading;
  size_t scan_ = 0, name_begin_ = 0, name_end_ = 0;
  MarkerSearch key_search_, value_search_;
  ArgumentObjectWriter object_;
};

}  // namespace

std::unique_ptr<OutputParser> make_glm4_output_parser(const OutputParserOptions& options) {
  auto tools = std::make_shared<const std::vector<ToolDefinition>>(options.tools);
  return std::make_unique<TaggedOutputParser>(options,
                                              [tools] { return std::make_unique<Glm4ToolCallBody>(tools); });
}

}  // namespace xmoe::serve
