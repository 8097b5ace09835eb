// DeepSeek's tool calls. Thinking is <think>…</think> (the prompt opens it when thinking is on).
//   V3.1:       <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{ARGS}<｜tool▁call▁end｜>…
//               <｜tool▁calls▁end｜>   (arguments stream out as the model writes them)
//   V3 / R1:    the same markers around function<｜tool▁sep｜>NAME\n```json\n{ARGS}\n```
//   V3.2 (DSML, ｜ is U+FF5C):  <｜DSML｜function_calls>\n<｜DSML｜invoke name="NAME">\n
//               <｜DSML｜parameter name="K"
//               string="true|false">VALUE</｜DSML｜parameter>\n…</｜DSML｜invoke>\n
//               </｜DSML｜function_calls>   (string="true": VALUE is the string itself, else JSON; one
//               arguments fragment per parameter)
#include <optional>

#include "serve/output_parsers.hpp"
#include "serve/tagged_output_parser.hpp"
#include "serve/tool_call_bodies.hpp"

namespace xmoe::serve {

namespace {

class DeepseekV3ToolCallBody final : public ToolCallBodyParser {
 public:
  void push(std::string_view text, int index, std::vector<OutputEvent>& out) override {
    if (args_) {
      args_->push(text, index, out);
      return;
    }
    head_ += text;
    const size_t sep = sep_search_.find(head_, kSep, 0);
    if (sep == std::string::npos) return;
    std::string name = std::string(trim_json_space(std::string_view(head_).substr(0, sep)));
    std::string_view rest = std::string_view(head_).substr(sep + kSep.size());
    const size_t first = rest.find_first_not_of(" \t\r\n");
    if (first == std::string_view::npos) return;
    if (name == "function" && rest[first] != '{' && rest[first] != '"') {
      // DeepSeek-V3 / R1: function<｜tool▁sep｜>NAME\n```json\nARGS\n```
      const size_t newline = rest.find('\n', first);
      if (newline == std::string_view::npos) return;
      name = std::string(trim_json_space(rest.substr(0, newline)));
      rest.remove_prefix(newline + 1);
      const size_t fence = rest.find_first_not_of(" \t\r\n");
      if (fence == std::string_view::npos) return;
      const std::string_view from_fence = rest.substr(fence);
      if (from_fence.starts_with("```")) {
        const size_t line_end = rest.find('\n', fence);
        if (line_end == std::string_view::npos) return;
        rest.remove_prefix(line_end + 1);
      } else if (std::string_view("```").starts_with(from_fence)) {
        return;  // "`" or "``": not yet known whether a fence opens
      }
    }
    if (name.empty()) return;  // no call: given back as text at its end
    args_.emplace(std::move(name));
    args_->push(rest, index, out);
  }

  bool end(bool, int index, std::vector<OutputEvent>& out) override {
    return args_ && args_->end(index, out);
  }

 private:
  static constexpr std::string_view kSep = "<｜tool▁sep｜>";
  std::string head_;
  MarkerSearch sep_search_;
  std::optional<JsonArgumentsStream> args_;
};

// The body after `<｜DSML｜invoke name="`: NAME">, then the parameters.
class DeepseekV32ToolCallBody final : public ToolCallBodyParser {
 public:
  explicit DeepseekV32ToolCallBody(std::shared_ptr<const std::vector<ToolDefinition>> tools)
      : tools_(std::move(tools)) {}

  void push(std::string_view text, int index, std::vector<OutputEvent>& out) override {
    body_ += text;
    if (!begun_) {
      const size_t close = name_search_.find(body_, "\">", 0);
      if (close == std::string::npos) return;
      name_ = body_.substr(0, close);
      pos_ = close + 2;
      begun_ = true;
      emit_tool_call_begin(name_, index, out);
    }
    for (;;) {
      if (!in_value_) {
        const size_t open = open_search_.find(body_, kParamOpen, pos_);
        if (open == std::string::npos) return;
        const size_t close = body_.find('>', open);
        if (close == std::string::npos) return;
        const std::string_view attrs = std::string_view(body_).substr(open, close - open);
        param_ = attribute(attrs, "name");
        string_attr_ = attribute(attrs, "string");
        pos_ = close + 1;
        in_value_ = true;
      }
      const size_t end = close_search_.find(body_, kParamClose, pos_);
      if (end == std::string::npos) return;
      emit_param(body_.substr(pos_, end - pos_), index, out);
      pos_ = end + kParamClose.size();
    }
  }

  bool end(bool, int index, std::vector<OutputEvent>& out) override {
    if (!begun_) return false;
    if (in_value_) emit_param(body_.substr(pos_), index, out);
    object_.close(index, out);
    append_event(out, OutputEvent::Kind::tool_call_end, "", index);
    return true;
  }

 private:
  static constexpr std::string_view kParamOpen = "<｜DSML｜parameter";
  static constexpr std::string_view kParamClose = "</｜DSML｜parameter>";

  static std::string attribute(std::string_view attrs, std::string_view key) {
    std::string pattern = " ";  // built piecewise: GCC 12 warns (-Wrestrict) on " " + std::string(...)
    pattern.append(key).append("=\"");
    const size_t at = attrs.find(pattern);
    if (at == std::string_view::npos) return "";
    const size_t begin = at + pattern.size();
    const size_t end = attrs.find('"', begin);
    return std::string(attrs.substr(begin, end == std::string_view::npos ? end : end - begin));
  }

  void emit_param(const std::string& value, int index, std::vector<OutputEvent>& out) {
    // A parameter without string="…" is read as its schema says.
    const bool as_string = string_attr_.empty()
                               ? schema_allows_string(parameter_schema(*tools_, name_, param_))
                               : string_attr_ == "true";
    object_.add(param_, argument_value_json(value, as_string), index, out);
    in_value_ = false;
  }

  std::shared_ptr<const std::vector<ToolDefinition>> tools_;
  std::string body_, name_, param_, string_attr_;
  size_t pos_ = 0;
  bool begun_ = false, in_value_ = false;
  MarkerSearch name_search_, open_search_, close_search_;
  ArgumentObjectWriter object_;
};

}  // namespace

std::unique_ptr<OutputParser> make_deepseek_v3_output_parser(const OutputParserOptions& options) {
  TaggedMarkup markup;
  markup.call_open = "<｜tool▁call▁begin｜>";
  markup.call_close = "<｜tool▁call▁end｜>";
  markup.call_group_markers = {"<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"};
  return std::make_unique<TaggedOutputParser>(
      options, [] { return std::make_unique<DeepseekV3ToolCallBody>(); }, markup);
}

std::unique_ptr<OutputParser> make_deepseek_v32_output_parser(const OutputParserOptions& options) {
  TaggedMarkup markup;
  markup.call_open = "<｜DSML｜invoke name=\"";
  markup.call_close = "</｜DSML｜invoke>";
  markup.call_group_markers = {"<｜DSML｜function_calls>", "</｜DSML｜function_calls>"};
  auto tools = std::make_shared<const std::vector<ToolDefinition>>(options.tools);
  return std::make_unique<TaggedOutputParser>(
      options, [tools] { return std::make_unique<DeepseekV32ToolCallBody>(tools); }, markup);
}

}  // namespace xmoe::serve
