// Model output of arbitrary text through the tool-call/thinking parsers (plain, Qwen3 <tool_call> JSON,
// Qwen3-Coder <function=...>, harmony, DeepSeek-V3.1 and V3.2, Kimi-K2, GLM), as the engine delivers it:
// valid UTF-8. Byte 0 picks the options and, with byte 1's high nibble, the format; byte 1's low nibble the
// chunk size the text streams in. Properties: every finished tool call's argument fragments join to a JSON
// object, and the events do not depend on how the text was split into pieces (compared after joining adjacent
// pieces of the same kind).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fuzz_support.hpp"
#include "llm/tokenizer/utf8.hpp"
#include "serve/output_parser.hpp"

namespace {

using xmoe::serve::OutputEvent;

void check(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_output_parser: %s\n", what.c_str());
    std::abort();
  }
}

// One line per text/thinking run or tool call, so splitting a run into several events compares equal.
std::vector<std::string> normalized(const std::vector<OutputEvent>& events) {
  std::vector<std::string> out;
  std::string args;
  OutputEvent::Kind last = OutputEvent::Kind::tool_call_end;
  for (const OutputEvent& e : events) {
    switch (e.kind) {
      case OutputEvent::Kind::text:
      case OutputEvent::Kind::thinking:
        if (e.text.empty()) continue;
        if (out.empty() || last != e.kind) out.push_back(e.kind == OutputEvent::Kind::text ? "T:" : "R:");
        out.back() += e.text;
        break;
      case OutputEvent::Kind::tool_call_begin:
        args.clear();
        out.push_back(std::to_string(e.tool_index) + ":call " + e.tool_name);
        break;
      case OutputEvent::Kind::tool_call_arguments:
        args += e.text;
        break;
      case OutputEvent::Kind::tool_call_end: {
        const auto parsed = nlohmann::json::parse(args, nullptr, false);
        check(!parsed.is_discarded() && parsed.is_object(),
              "tool call arguments are not a JSON object: " + args);
        out.back() += " " + args;
        break;
      }
    }
    last = e.kind;
  }
  return out;
}

std::vector<xmoe::serve::ToolDefinition> tools() {
  xmoe::serve::ToolDefinition t;
  t.name = "get_weather";
  t.parameters = nlohmann::ordered_json::parse(
      R"({"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
          "metric": {"type": "boolean"}, "where": {"type": "object"}, "hours": {"type": "array"},
          "ratio": {"type": "number"}}})");
  return {t};
}

std::vector<OutputEvent> run(xmoe::serve::OutputFormat format,
                             const xmoe::serve::OutputParserOptions& options, std::string_view text,
                             size_t chunk) {
  const auto parser = xmoe::serve::make_output_parser(format, options);
  std::vector<OutputEvent> events;
  for (size_t i = 0; i < text.size(); i += chunk) parser->push(text.substr(i, chunk), events);
  parser->finish(events);
  return events;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  static const std::vector<xmoe::serve::ToolDefinition> offered = tools();
  using F = xmoe::serve::OutputFormat;
  static constexpr F kFormats[] = {F::plain,       F::qwen3,        F::qwen3_coder, F::harmony,
                                   F::deepseek_v3, F::deepseek_v32, F::kimi_k2,     F::glm4};
  // Byte 0 % 3 alone picked the format when there were three; byte 1's high nibble (which the chunk size
  // does not use) adds 3 × itself, so the older seeds keep their format.
  const F format = kFormats[(data[0] % 3 + 3 * (data[1] >> 4)) % std::size(kFormats)];
  xmoe::serve::OutputParserOptions options;
  options.parse_tools = (data[0] >> 2) & 1;
  options.parse_thinking = (data[0] >> 3) & 1;
  options.starts_in_thinking = (data[0] >> 4) & 1;
  if ((data[0] >> 5) & 1) options.tools = offered;
  const size_t chunk = 1 + data[1] % 16;
  // The engine hands the parsers complete UTF-8 (invalid bytes already replaced), so the input is repaired
  // the same way.
  const std::string text = xmoe::tokenizer_detail::to_valid_utf8(xmoe::fuzz::as_text(data + 2, size - 2));

  const auto whole = normalized(run(format, options, text, text.size() + 1));
  const auto pieces = normalized(run(format, options, text, chunk));
  check(whole == pieces, "events depend on how the text was split (chunk " + std::to_string(chunk) + ")");
  return 0;
}
