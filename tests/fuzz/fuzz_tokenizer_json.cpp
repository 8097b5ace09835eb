// tokenizer.json of arbitrary bytes: loading either gives a tokenizer or throws xmoe::Error naming the field;
// a loaded one then encodes and decodes a fixed mixed-script text.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_support.hpp"
#include "xmoe/error.hpp"
#include "xmoe/tokenizer.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto t = xmoe::Tokenizer::from_json(std::string(xmoe::fuzz::as_text(data, size)), "tokenizer.json");
    const std::vector<int32_t> ids = t.encode("Hello  world 123 ünïcödé 😀\n\tx", true);
    std::vector<int32_t> all;
    for (int32_t id = -1; id < std::min<int64_t>(t.vocab_size() + 1, 64); ++id) all.push_back(id);
    volatile size_t sink = ids.size() + t.decode(ids).size() + t.decode(all, true).size();
    (void)sink;
  } catch (const xmoe::Error&) {
  }
  return 0;
}
