// Template text of arbitrary bytes through the Jinja lexer, parser and interpreter: parsing either gives a
// program or throws xmoe::Error naming the line; rendering against a chat context either gives text or
// throws xmoe::Error naming the line. Hostile templates must stay bounded (no hang, no huge allocation).
#include <cstdint>
#include <ctime>
#include <nlohmann/json.hpp>
#include <string>

#include "fuzz_support.hpp"
#include "xmoe/chat_template.hpp"
#include "xmoe/error.hpp"

namespace {

const nlohmann::ordered_json& context() {
  static const nlohmann::ordered_json c = nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "You are terse."},
      {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
      {"role": "assistant", "content": "", "reasoning_content": "use the tool",
       "tool_calls": [{"id": "c1", "type": "function",
                       "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "{\"temp\": 21}"}
    ],
    "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                              "required": ["city"]}}}],
    "add_generation_prompt": true, "enable_thinking": false, "bos_token": "<s>", "eos_token": "</s>",
    "n": 3, "f": 2.5, "none": null
  })");
  return c;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::tm now{};
  now.tm_year = 126, now.tm_mon = 2, now.tm_mday = 7, now.tm_hour = 9;
  try {
    const auto t = xmoe::ChatTemplate::parse(std::string(xmoe::fuzz::as_text(data, size)), "fuzz.jinja");
    volatile size_t sink = t.render_ordered(context(), now).size();
    (void)sink;
  } catch (const xmoe::Error&) {
  }
  return 0;
}
