// Qwen3 (and Hermes-style) tool calls: <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>.
// The usual key order (name first) is read as it streams, so the arguments go out in fragments as the model
// writes them; any other shape is parsed whole when </tool_call> arrives.
#include <nlohmann/json.hpp>

#include "serve/json_prefix.hpp"
#include "serve/output_parsers.hpp"
#include "serve/tagged_output_parser.hpp"

namespace xmoe::serve {

namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

// Reads `{"name": "NAME", "arguments": ` from the front of a body.
class HeaderReader {
 public:
  enum class Result { more, matched, mismatch };
  explicit HeaderReader(std::string_view s) : s_(s) {}

  Result read(std::string& name, size_t& end) {
    if (!token("{") || !token("\"name\"") || !token(":") || !token("\"")) return result_;
    const size_t close = s_.find('"', pos_);
    const size_t escape = s_.find('\\', pos_);
    if (escape < close) return Result::mismatch;  // escaped names are left to the whole-body parse
    if (close == std::string_view::npos) return Result::more;
    name = std::string(s_.substr(pos_, close - pos_));
    pos_ = close + 1;
    if (!token(",") || !token("\"arguments\"") || !token(":")) return result_;
    while (pos_ < s_.size() && is_space(s_[pos_])) ++pos_;
    if (pos_ == s_.size()) return Result::more;
    end = pos_;
    return Result::matched;
  }

 private:
  // Skips whitespace, then matches `lit`; on failure result_ says whether more text could still match.
  bool token(std::string_view lit) {
    while (pos_ < s_.size() && is_space(s_[pos_])) ++pos_;
    const std::string_view rest = s_.substr(pos_);
    const size_t n = std::min(rest.size(), lit.size());
    if (rest.substr(0, n) != lit.substr(0, n)) {
      result_ = Result::mismatch;
      return false;
    }
    if (n < lit.size()) {
      result_ = Result::more;
      return false;
    }
    pos_ += lit.size();
    return true;
  }

  std::string_view s_;
  size_t pos_ = 0;
  Result result_ = Result::more;
};

class Qwen3ToolCallBody final : public ToolCallBodyParser {
 public:
  void push(std::string_view text, int index, std::vector<OutputEvent>& out) override {
    body_ += text;
    if (phase_ == Phase::header) {
      std::string name;
      size_t end = 0;
      switch (HeaderReader(body_).read(name, end)) {
        case HeaderReader::Result::more:
          return;
        case HeaderReader::Result::mismatch:
          phase_ = Phase::whole;
          return;
        case HeaderReader::Result::matched:
          OutputEvent begin;
          begin.kind = OutputEvent::Kind::tool_call_begin;
          begin.tool_index = index;
          begin.tool_name = name;
          out.push_back(std::move(begin));
          phase_ = Phase::arguments;
          text = std::string_view(body_).substr(end);
          break;
      }
    }
    if (phase_ == Phase::arguments) {
      const size_t n = args_.push(text);
      append_event(out, OutputEvent::Kind::tool_call_arguments, text.substr(0, n), index);
      // Whatever follows the arguments (the closing brace, or text that breaks the JSON) is not streamed;
      // end() closes the arguments so that they parse.
      if (n < text.size()) phase_ = Phase::after;
    }
  }

  bool end(bool, int index, std::vector<OutputEvent>& out) override {
    switch (phase_) {
      case Phase::header:
        return false;
      case Phase::whole:
        return end_whole(index, out);
      case Phase::arguments:
      case Phase::after:
        append_event(out, OutputEvent::Kind::tool_call_arguments, args_.completion(), index);
        append_event(out, OutputEvent::Kind::tool_call_end, "", index);
        return true;
    }
    return false;
  }

 private:
  enum class Phase { header, arguments, after, whole };

  bool end_whole(int index, std::vector<OutputEvent>& out) {
    const auto j = nlohmann::ordered_json::parse(body_, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return false;
    nlohmann::ordered_json args = j.contains("arguments") ? j["arguments"] : nlohmann::ordered_json::object();
    if (args.is_string()) args = nlohmann::ordered_json::parse(args.get<std::string>(), nullptr, false);
    if (!args.is_object()) return false;
    OutputEvent begin;
    begin.kind = OutputEvent::Kind::tool_call_begin;
    begin.tool_index = index;
    begin.tool_name = j["name"].get<std::string>();
    out.push_back(std::move(begin));
    append_event(out, OutputEvent::Kind::tool_call_arguments,
                 args.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace), index);
    append_event(out, OutputEvent::Kind::tool_call_end, "", index);
    return true;
  }

  Phase phase_ = Phase::header;
  std::string body_;
  JsonPrefix args_;
};

}  // namespace

std::unique_ptr<OutputParser> make_qwen3_output_parser(const OutputParserOptions& options) {
  return std::make_unique<TaggedOutputParser>(options, [] { return std::make_unique<Qwen3ToolCallBody>(); });
}

}  // namespace xmoe::serve
