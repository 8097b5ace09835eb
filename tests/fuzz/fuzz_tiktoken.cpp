// tiktoken vocabularies: byte 0 picks what the rest is.
//   0: a tiktoken.model file (with the fixture's tokenizer_config.json); when it loads, the fixture corpus
//      sample is encoded with it and must decode back;
//   1: a tokenizer_config.json for the fixture's tiktoken.model (parsed once at start-up);
//   otherwise: text encoded and decoded with the fixture vocabulary (Kimi-K2's pattern and specials), and the
//      same bytes read as token ids.
// Properties: a bad file gives xmoe::Error only; every id encode gives is in the vocabulary;
// decode(encode(t)) is t repaired to valid UTF-8 (the pattern covers every character); the heap BPE equals
// tiktoken's plain loop on every piece; streaming decode equals whole decode.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_support.hpp"
#include "llm/tokenizer/json_fields.hpp"
#include "llm/tokenizer/tiktoken_tokenizer.hpp"
#include "llm/tokenizer/utf8.hpp"
#include "xmoe/error.hpp"
#include "xmoe/tokenizer.hpp"

namespace {

namespace td = xmoe::tokenizer_detail;

struct Fixture {
  std::string config_text;
  // Parsed once: a fuzzed tokenizer_config.json is read against it without parsing 3,800 ranks per input.
  std::shared_ptr<const td::TiktokenVocabulary> vocabulary;
  td::TiktokenTokenizer detail;
  xmoe::Tokenizer tokenizer;
};

const Fixture& fixture() {
  static const Fixture f = [] {
    const std::string model = xmoe::fuzz::read_file(xmoe::fuzz::data_path("tiktoken/tiktoken.model"));
    const std::string config = xmoe::fuzz::read_file(xmoe::fuzz::data_path("tiktoken/tokenizer_config.json"));
    auto vocabulary = std::make_shared<const td::TiktokenVocabulary>(model, "tiktoken.model");
    return Fixture{config, vocabulary, td::TiktokenTokenizer(vocabulary, td::Json::parse(config), "c"),
                   xmoe::Tokenizer::from_tiktoken(model, "tiktoken.model", config, "tokenizer_config.json")};
  }();
  return f;
}

constexpr std::string_view kSample = "Hello, world! 你好 <|im_end|> [EOS] 123 \xF0\x9F\x9A\x80\n\n  x";

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_tiktoken: %s\n", what);
    std::abort();
  }
}

// The fixture's pattern matches every character (Kimi's does; tiktoken drops text a pattern leaves
// unmatched).
void check_round_trip(const xmoe::Tokenizer& t, std::string_view text) {
  const std::vector<int32_t> ids = t.encode(text);
  for (const int32_t id : ids)
    check(id >= 0 && id < t.vocab_size(), "encode gave an id outside the vocabulary");
  check(t.decode(ids) == td::to_valid_utf8(text), "decode(encode(text)) is not the text");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const Fixture& f = fixture();
  const auto rest = xmoe::fuzz::as_text(data + 1, size - 1);
  if (data[0] == 0) {
    try {
      check_round_trip(xmoe::Tokenizer::from_tiktoken(rest, "tiktoken.model", f.config_text, "config"),
                       kSample);
    } catch (const xmoe::Error&) {
    }
    return 0;
  }
  if (data[0] == 1) {
    // Not JSON: from_tiktoken's error, nothing of the tokenizer runs. Empty: no tokenizer_config.json.
    const td::Json config = rest.empty() ? td::Json() : td::Json::parse(rest, nullptr, false);
    if (config.is_discarded()) return 0;
    try {
      const td::TiktokenTokenizer t(f.vocabulary, config, "config");
      for (const int32_t id : t.encode(kSample, false)) {
        check(id >= 0 && id < t.vocab_size(), "encode gave an id outside the vocabulary");
        volatile size_t sink = t.decoded_piece(id, false).value_or("").size();
        (void)sink;
      }
    } catch (const xmoe::Error&) {
    }
    return 0;
  }

  check_round_trip(f.tokenizer, rest);
  const std::string valid = td::to_valid_utf8(rest);
  for (std::string_view piece : f.detail.split(valid)) {
    if (piece.size() > 512) continue;  // the reference loop is quadratic
    std::vector<int32_t> fast, reference;
    f.detail.vocabulary().encode_piece(piece, fast);
    f.detail.vocabulary().encode_piece_reference(piece, reference);
    check(fast == reference, "heap BPE differs from tiktoken's loop");
  }

  // The same bytes as token ids, including ids outside the vocabulary (skipped).
  const bool skip_special = data[0] % 2 == 1;
  std::vector<int32_t> raw((size - 1) / 4);
  if (!raw.empty()) std::memcpy(raw.data(), data + 1, raw.size() * 4);
  for (int32_t& id : raw) id %= static_cast<int32_t>(f.tokenizer.vocab_size() + 8);
  const std::string whole = f.tokenizer.decode(raw, skip_special);
  xmoe::Tokenizer::StreamDecoder stream(f.tokenizer, skip_special);
  std::string streamed;
  for (const int32_t id : raw) streamed += stream.push(id);
  streamed += stream.flush();
  check(streamed == whole, "streaming decode differs from whole decode");
  return 0;
}
