// Qwen3-Coder tool calls: <tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n…</function>\n
// </tool_call>. Values are untyped text; they become JSON typed by the tool's schema (integer, number,
// boolean, object, array, null where the text is one; string otherwise). Each parameter goes out as one
// arguments fragment once its value is complete.
#include <charconv>
#include <nlohmann/json.hpp>

#include "serve/output_parsers.hpp"
#include "serve/tagged_output_parser.hpp"

namespace xmoe::serve {

namespace {

using ojson = nlohmann::ordered_json;

std::string dump(const ojson& j) {
  return j.dump(-1, ' ', false, ojson::error_handler_t::replace);
}

std::vector<std::string> schema_types(const ojson& schema) {
  std::vector<std::string> types;
  if (!schema.is_object() || !schema.contains("type")) return types;
  const ojson& t = schema["type"];
  if (t.is_string()) types.push_back(t.get<std::string>());
  if (t.is_array())
    for (const auto& e : t)
      if (e.is_string()) types.push_back(e.get<std::string>());
  return types;
}

// The JSON for a parameter's text under its schema type; string when the text is not of that type.
std::string typed_value(const std::string& text, const ojson* schema) {
  const std::vector<std::string> types = schema ? schema_types(*schema) : std::vector<std::string>{};
  for (const std::string& type : types) {
    if (type == "string") break;
    if (type == "integer") {
      int64_t v = 0;
      const auto r = std::from_chars(text.data(), text.data() + text.size(), v);
      if (r.ec == std::errc() && r.ptr == text.data() + text.size()) return std::to_string(v);
      continue;
    }
    if (type == "boolean") {
      if (text == "true" || text == "True") return "true";
      if (text == "false" || text == "False") return "false";
      continue;
    }
    if (type == "null") {
      if (text == "null" || text == "None") return "null";
      continue;
    }
    const ojson j = ojson::parse(text, nullptr, /*allow_exceptions=*/false);
    if ((type == "number" && j.is_number()) || (type == "object" && j.is_object()) ||
        (type == "array" && j.is_array()))
      return dump(j);
  }
  return dump(ojson(text));
}

class Qwen3CoderToolCallBody final : public ToolCallBodyParser {
 public:
  explicit Qwen3CoderToolCallBody(std::shared_ptr<const std::vector<ToolDefinition>> tools)
      : tools_(std::move(tools)) {}

  void push(std::string_view text, int index, std::vector<OutputEvent>& out) override {
    body_ += text;
    for (;;) {
      if (!begun_) {
        const size_t open = body_.find("<function=", pos_);
        if (open == std::string::npos) return;
        const size_t close = body_.find('>', open);
        if (close == std::string::npos) return;
        name_ = body_.substr(open + 10, close - open - 10);
        pos_ = close + 1;
        begun_ = true;
        OutputEvent begin;
        begin.kind = OutputEvent::Kind::tool_call_begin;
        begin.tool_index = index;
        begin.tool_name = name_;
        out.push_back(std::move(begin));
        append_event(out, OutputEvent::Kind::tool_call_arguments, "{", index);
        continue;
      }
      if (closed_) return;
      if (!in_param_) {
        const size_t open = body_.find("<parameter=", pos_);
        const size_t fn_close = body_.find("</function>", pos_);
        if (fn_close < open) {
          close_object(index, out);
          return;
        }
        if (open == std::string::npos) return;
        const size_t close = body_.find('>', open);
        if (close == std::string::npos) return;
        param_ = body_.substr(open + 11, close - open - 11);
        pos_ = close + 1;
        in_param_ = true;
        continue;
      }
      // A value ends at </parameter>, or where the next parameter or the function's end begins.
      size_t end = std::string::npos, resume = 0;
      for (std::string_view m : {"</parameter>", "<parameter=", "</function>"}) {
        const size_t p = body_.find(m, pos_);
        if (p < end) end = p, resume = m == "</parameter>" ? p + m.size() : p;
      }
      if (end == std::string::npos) return;
      emit_param(body_.substr(pos_, end - pos_), index, out);
      pos_ = resume;
    }
  }

  bool end(bool, int index, std::vector<OutputEvent>& out) override {
    if (!begun_) return false;
    if (in_param_) emit_param(body_.substr(pos_), index, out);
    if (!closed_) close_object(index, out);
    append_event(out, OutputEvent::Kind::tool_call_end, "", index);
    return true;
  }

 private:
  void emit_param(std::string value, int index, std::vector<OutputEvent>& out) {
    if (!value.empty() && value.front() == '\n') value.erase(0, 1);
    if (!value.empty() && value.back() == '\n') value.pop_back();
    std::string fragment = params_ == 0 ? "" : ", ";
    fragment += dump(ojson(param_)) + ": " + typed_value(value, param_schema());
    append_event(out, OutputEvent::Kind::tool_call_arguments, fragment, index);
    ++params_;
    in_param_ = false;
  }

  void close_object(int index, std::vector<OutputEvent>& out) {
    append_event(out, OutputEvent::Kind::tool_call_arguments, "}", index);
    closed_ = true;
  }

  const ojson* param_schema() const {
    for (const ToolDefinition& t : *tools_) {
      if (t.name != name_) continue;
      const auto props = t.parameters.find("properties");
      if (props == t.parameters.end() || !props->is_object()) continue;
      const auto p = props->find(param_);
      if (p != props->end()) return &*p;
    }
    return nullptr;
  }

  std::shared_ptr<const std::vector<ToolDefinition>> tools_;
  std::string body_, name_, param_;
  size_t pos_ = 0;
  bool begun_ = false, in_param_ = false, closed_ = false;
  int params_ = 0;
};

}  // namespace

std::unique_ptr<OutputParser> make_qwen3_coder_output_parser(const OutputParserOptions& options) {
  auto tools = std::make_shared<const std::vector<ToolDefinition>>(options.tools);
  return std::make_unique<TaggedOutputParser>(
      options, [tools] { return std::make_unique<Qwen3CoderToolCallBody>(tools); });
}

}  // namespace xmoe::serve
