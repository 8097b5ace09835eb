// Arbitrary bytes through real vocabularies (byte-level BPE as Qwen2, with byte fallback, with a Prepend
// normalizer). Byte 0 picks the tokenizer and flags; the rest is the text, and also read as token ids.
// Properties: every id encode gives is in the vocabulary, and streaming decode equals whole decode.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "fuzz_support.hpp"
#include "xmoe/error.hpp"
#include "xmoe/tokenizer.hpp"

namespace {

const std::vector<xmoe::Tokenizer>& tokenizers() {
  static const std::vector<xmoe::Tokenizer> all = [] {
    std::vector<xmoe::Tokenizer> v;
    for (const char* name : {"qwen2", "variant-byte-fallback", "variant-prepend"})
      v.push_back(xmoe::Tokenizer::from_file(
          xmoe::fuzz::data_path(std::string("tokenizer/") + name + "/tokenizer.json")));
    return v;
  }();
  return all;
}

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_tokenizer_encode: %s\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const auto& all = tokenizers();
  const xmoe::Tokenizer& t = all[data[0] % all.size()];
  const bool special = (data[0] / all.size()) % 2 == 1;
  const auto text = xmoe::fuzz::as_text(data + 1, size - 1);

  const std::vector<int32_t> ids = t.encode(text, special);
  for (const int32_t id : ids)
    check(id >= 0 && id < t.vocab_size(), "encode gave an id outside the vocabulary");
  const std::string decoded = t.decode(ids, false);

  // The same bytes as token ids, including ids outside the vocabulary (skipped, as HF does).
  std::vector<int32_t> raw((size - 1) / 4);
  if (!raw.empty()) std::memcpy(raw.data(), data + 1, raw.size() * 4);
  for (int32_t& id : raw) id %= static_cast<int32_t>(t.vocab_size() + 8);
  const std::string whole = t.decode(raw, special);
  xmoe::Tokenizer::StreamDecoder stream(t, special);
  std::string streamed;
  for (const int32_t id : raw) streamed += stream.push(id);
  streamed += stream.flush();
  check(streamed == whole, "streaming decode differs from whole decode");
  volatile size_t sink = decoded.size();
  (void)sink;
  return 0;
}
