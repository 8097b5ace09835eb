// An OpenAI chat-completions body of arbitrary bytes: parsed, validated and prepared for the engine, or a
// 400 naming the field.
#include <cstdint>

#include "request_harness.hpp"
#include "serve/openai_request.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  xmoe::fuzz::run_chat_request(xmoe::fuzz::as_text(data, size), [](const auto& body, const auto& info) {
    return xmoe::serve::parse_openai_chat_request(body, info);
  });
  return 0;
}
