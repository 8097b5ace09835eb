// Pieces the tool-call body parsers of DeepSeek, Kimi and GLM share: arguments written as one JSON object
// after the call's name, and arguments written one parameter at a time that become a JSON object.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "serve/json_prefix.hpp"
#include "serve/output_parser.hpp"

namespace xmoe::serve {

// The arguments of a call whose name is already read, written as JSON (DeepSeek-V3.1, Kimi-K2). An object
// streams out in fragments as it arrives (what follows it is ignored; a cut-off object is closed so that it
// parses). Anything else is read whole at the end: a JSON string holding an object (what DeepSeek-V3.1's
// template writes for arguments that were a string) is that object; other text is no call.
class JsonArgumentsStream {
 public:
  explicit JsonArgumentsStream(std::string name) : name_(std::move(name)) {}
  void push(std::string_view text, int index, std::vector<OutputEvent>& out);
  // Returns false (nothing emitted) when the arguments are no JSON object.
  bool end(int index, std::vector<OutputEvent>& out);

 private:
  enum class Phase { start, streaming, after, whole };
  std::string name_, whole_;
  Phase phase_ = Phase::start;
  JsonPrefix args_;
};

// Builds the arguments object one parameter at a time (GLM's <arg_key>/<arg_value>, DeepSeek-V3.2's
// <｜DSML｜parameter>): "{" with the first, one fragment per parameter, "}" at close.
class ArgumentObjectWriter {
 public:
  void add(const std::string& key, const std::string& json_value, int index, std::vector<OutputEvent>& out);
  void close(int index, std::vector<OutputEvent>& out);

 private:
  int count_ = 0;
};

// Finds a marker in a body that grows push by push without searching the same bytes again each time (a call's
// long value would otherwise cost time quadratic in its length). One per place a body looks for a marker.
class MarkerSearch {
 public:
  // text.find(marker, from), resuming where the last unsuccessful search for it stopped (less the bytes a
  // marker split across pushes may already have).
  size_t find(const std::string& text, std::string_view marker, size_t from);

 private:
  size_t resume_ = 0;
};

void emit_tool_call_begin(const std::string& name, int index, std::vector<OutputEvent>& out);

// The schema of `tool`'s parameter `param` among the offered tools, or null.
const nlohmann::ordered_json* parameter_schema(const std::vector<ToolDefinition>& tools,
                                               std::string_view tool, std::string_view param);
bool schema_allows_string(const nlohmann::ordered_json* schema);

// A parameter value written as plain text: the string itself when `as_string`, else the JSON it is, falling
// back to the string when it is no JSON (the reading vLLM's GLM and DeepSeek parsers give).
std::string argument_value_json(const std::string& text, bool as_string);

std::string dump_json(const nlohmann::ordered_json& j);

// JSON's whitespace (space, tab, newline, carriage return): what the families' markup puts around names.
inline bool is_json_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}
// `s` without leading and trailing JSON whitespace.
inline std::string_view trim_json_space(std::string_view s) {
  while (!s.empty() && is_json_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_json_space(s.back())) s.remove_suffix(1);
  return s;
}

}  // namespace xmoe::serve
