// An Anthropic Messages body of arbitrary bytes: parsed, validated and prepared for the engine, or a 400
// naming the field. The count_tokens form (max_tokens optional) is parsed too.
#include <cstdint>

#include "request_harness.hpp"
#include "serve/anthropic_request.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  for (const bool for_count_tokens : {false, true})
    xmoe::fuzz::run_chat_request(xmoe::fuzz::as_text(data, size), [&](const auto& body, const auto& info) {
      return xmoe::serve::parse_anthropic_request(body, info, for_count_tokens);
    });
  return 0;
}
