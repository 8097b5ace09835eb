// Tokenizer against Hugging Face `tokenizers` (fixtures from tools/make_tokenizer_fixtures.py): ids, decode
// and streaming decode on a shared corpus, for a tiny trained vocabulary, pipeline variants of it and real
// vocabularies (GPT-2, DeepSeek-LLM, DeepSeek-Coder with llama.cpp's reference ids; Qwen2, DeepSeek-V4).
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "llm/tokenizer/bpe_model.hpp"
#include "llm/tokenizer/byte_level.hpp"
#include "xmoe/error.hpp"
#include "xmoe/tokenizer.hpp"

namespace {

using nlohmann::json;
const std::string kDir = std::string(XMOE_TEST_DATA_DIR) + "/tokenizer/";

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << path;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<json> read_jsonl(const std::string& path) {
  std::vector<json> lines;
  std::istringstream in(read_file(path));
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) lines.push_back(json::parse(line));
  return lines;
}

std::string from_hex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    out += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  return out;
}

const std::vector<std::string>& corpus() {
  static const std::vector<std::string> texts = [] {
    std::vector<std::string> out;
    for (const json& line : read_jsonl(kDir + "corpus.jsonl"))
      out.push_back(line.contains("hex") ? from_hex(line["hex"]) : line["text"].get<std::string>());
    return out;
  }();
  return texts;
}

// Independent of the library: is s well-formed UTF-8 (no truncated or ill-formed sequence)?
bool is_valid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<unsigned char>(s[i]);
    int n = b < 0x80 ? 1 : (b >> 5) == 0x6 ? 2 : (b >> 4) == 0xE ? 3 : (b >> 3) == 0x1E ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    uint32_t cp = n == 1 ? b : b & (0xFF >> (n + 1));
    for (int k = 1; k < n; ++k) {
      const auto c = static_cast<unsigned char>(s[i + k]);
      if ((c & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (c & 0x3F);
    }
    const uint32_t min[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n;
  }
  return true;
}

std::vector<int32_t> ids_of(const json& array) {
  return array.get<std::vector<int32_t>>();
}

// Streams ids one at a time; every piece must be whole characters, and the pieces must add up to `expected`.
void expect_stream(const xmoe::Tokenizer& tok, const std::vector<int32_t>& ids, bool skip,
                   const std::string& expected, const std::string& what) {
  xmoe::Tokenizer::StreamDecoder stream(tok, skip);
  std::string joined;
  for (int32_t id : ids) {
    const std::string piece = stream.push(id);
    ASSERT_TRUE(is_valid_utf8(piece)) << what << ": push(" << id << ") emitted part of a character";
    joined += piece;
  }
  const std::string rest = stream.flush();
  ASSERT_TRUE(is_valid_utf8(rest)) << what;
  joined += rest;
  EXPECT_EQ(joined, expected) << what;
}

struct Counts {
  size_t encoded = 0, decoded = 0;
};

Counts check_cases(const std::string& name) {
  const auto tok = xmoe::Tokenizer::from_file(kDir + name + "/tokenizer.json");
  Counts counts;
  for (const json& c : read_jsonl(kDir + name + "/cases.jsonl")) {
    if (c.contains("decode_ids")) {  // arbitrary ids, often not valid UTF-8 once mapped back to bytes
      const auto ids = ids_of(c["decode_ids"]);
      const std::string what = name + " decode " + c["decode_ids"].dump();
      EXPECT_EQ(tok.decode(ids), c["decoded"].get<std::string>()) << what;
      EXPECT_EQ(tok.decode(ids, true), c["decoded_skip"].get<std::string>()) << what;
      expect_stream(tok, ids, false, c["decoded"], what);
      expect_stream(tok, ids, true, c["decoded_skip"], what);
      ++counts.decoded;
      continue;
    }
    const std::string text =
        c.contains("i") ? corpus().at(c["i"].get<size_t>()) : c["text"].get<std::string>();
    const std::string what = name + " text " + json(c.contains("i") ? c["i"] : c["text"]).dump();
    const auto ids = ids_of(c["ids"]);
    EXPECT_EQ(tok.encode(text), ids) << what;
    EXPECT_EQ(tok.encode(text, true), c.contains("ids_special") ? ids_of(c["ids_special"]) : ids) << what;
    const std::string decoded = c.contains("decoded") ? c["decoded"].get<std::string>() : text;
    const std::string decoded_skip =
        c.contains("decoded_skip") ? c["decoded_skip"].get<std::string>() : decoded;
    EXPECT_EQ(tok.decode(ids), decoded) << what;
    EXPECT_EQ(tok.decode(ids, true), decoded_skip) << what;
    expect_stream(tok, ids, false, decoded, what);
    expect_stream(tok, ids, true, decoded_skip, what);
    ++counts.encoded;
  }
  return counts;
}

void check_vocabulary(const std::string& name) {
  const auto tok = xmoe::Tokenizer::from_file(kDir + name + "/tokenizer.json");
  const json meta = json::parse(read_file(kDir + name + "/meta.json"));
  EXPECT_EQ(tok.vocab_size(), meta["vocab_size"].get<int64_t>());
  for (const json& t : meta["tokens"]) {
    EXPECT_EQ(tok.id_to_token(t[1]), t[0].get<std::string>());
    EXPECT_EQ(tok.token_to_id(t[0].get<std::string>()), t[1].get<int32_t>());
  }
  for (const json& t : meta["added"]) {
    EXPECT_EQ(tok.token_to_id(t[0].get<std::string>()), t[1].get<int32_t>()) << t[0];
    EXPECT_EQ(tok.id_to_token(t[1]),
              t[3].get<std::string>());  // HF gives a normalized token's normalized form
    EXPECT_EQ(tok.is_special(t[1]), t[2].get<bool>()) << t[0];
  }
  EXPECT_EQ(tok.id_to_token(-1), "");
  EXPECT_EQ(tok.id_to_token(static_cast<int32_t>(tok.vocab_size())), "");
  EXPECT_FALSE(tok.token_to_id("\xff not a token"));
}

class TokenizerOracle : public ::testing::TestWithParam<std::string> {};

TEST_P(TokenizerOracle, MatchesHuggingFace) {
  const Counts counts = check_cases(GetParam());
  EXPECT_GT(counts.encoded, 100u);  // the fixture really was read
  check_vocabulary(GetParam());
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, TokenizerOracle,
    ::testing::Values("tiny-bpe", "variant-gpt2-style", "variant-flags", "variant-prepend",
                      "variant-split-removed", "variant-split-removed-invert", "variant-split-isolated",
                      "variant-split-isolated-invert", "variant-split-mergedwithprevious",
                      "variant-split-mergedwithprevious-invert", "variant-split-mergedwithnext",
                      "variant-split-mergedwithnext-invert", "variant-split-contiguous",
                      "variant-split-contiguous-invert", "variant-byte-fallback", "variant-unk",
                      "variant-unk-nofuse", "variant-subword-affixes", "gpt2", "deepseek-llm",
                      "deepseek-coder", "qwen2", "deepseek-v4", "o200k-harmony"),
    [](const auto& info) {
      std::string name = info.param;
      for (char& c : name)
        if (c == '-') c = '_';
      return name;
    });

TEST(Tokenizer, TinyBpeHasTheChatTokens) {
  const auto tok = xmoe::Tokenizer::from_file(kDir + "tiny-bpe/tokenizer.json");
  for (const char* special : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) {
    ASSERT_TRUE(tok.token_to_id(special)) << special;
    EXPECT_TRUE(tok.is_special(*tok.token_to_id(special)));
  }
  for (const char* added : {"<think>", "</think>"}) {
    ASSERT_TRUE(tok.token_to_id(added)) << added;
    EXPECT_FALSE(tok.is_special(*tok.token_to_id(added)));
  }
  const auto ids = tok.encode("<|im_start|>user\nhi<|im_end|>");
  EXPECT_EQ(ids.front(), *tok.token_to_id("<|im_start|>"));
  EXPECT_EQ(ids.back(), *tok.token_to_id("<|im_end|>"));
}

// The heap-based merge loop against the plain "merge the lowest-ranked pair, leftmost first" loop.
TEST(Tokenizer, FastBpeMatchesReferenceLoop) {
  using namespace xmoe::tokenizer_detail;
  for (const char* name : {"tiny-bpe", "qwen2", "deepseek-v4"}) {
    const json file = json::parse(read_file(kDir + name + "/tokenizer.json"));
    const BpeModel model(file["model"], JsonPath{name, "model"});
    std::mt19937 rng(1234);
    size_t checked = 0;
    for (const std::string& text : corpus()) {
      // Whole texts (long words stress the merge order) and random slices, byte-level mapped.
      std::string word = byte_level_table().encode(text);
      for (int k = 0; k < 3 && !word.empty(); ++k) {
        std::vector<int32_t> fast, reference;
        model.tokenize(word, fast);
        model.tokenize_reference(word, reference);
        ASSERT_EQ(fast, reference) << name << ": " << word;
        ++checked;
        const std::string raw = text.substr(std::uniform_int_distribution<size_t>(0, text.size())(rng));
        word = byte_level_table().encode(raw);
      }
    }
    EXPECT_GT(checked, 3000u);
  }
}

TEST(Tokenizer, InvalidUtf8IsReplacedLikePython) {
  // Python's bytes.decode("utf-8", "replace") of these is what HF sees; the corpus fixtures hold many more.
  const auto tok = xmoe::Tokenizer::from_file(kDir + "tiny-bpe/tokenizer.json");
  EXPECT_EQ(tok.encode("a\xff"
                       "b"),
            tok.encode("a\xEF\xBF\xBD"
                       "b"));
  EXPECT_EQ(tok.encode("\xe2\x82("), tok.encode("\xEF\xBF\xBD("));  // one U+FFFD for E2 82
  EXPECT_EQ(tok.encode("\xed\xa0\x80"),
            tok.encode("\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"));  // surrogate: three
  EXPECT_EQ(tok.decode(tok.encode("\xc3")), "\xEF\xBF\xBD");
}

TEST(Tokenizer, StreamingHoldsBackSplitCharacters) {
  const auto tok = xmoe::Tokenizer::from_file(kDir + "tiny-bpe/tokenizer.json");
  // One id per byte of "😀" (F0 9F 98 80): nothing can be printed before the last byte arrives.
  std::vector<int32_t> ids;
  for (unsigned char b : std::string("\xF0\x9F\x98\x80")) {
    ids.push_back(
        *tok.token_to_id(xmoe::tokenizer_detail::byte_level_table().encode(std::string(1, char(b)))));
  }
  xmoe::Tokenizer::StreamDecoder stream(tok);
  EXPECT_EQ(stream.push(ids[0]), "");
  EXPECT_EQ(stream.push(ids[1]), "");
  EXPECT_EQ(stream.push(ids[2]), "");
  EXPECT_EQ(stream.push(ids[3]), "\xF0\x9F\x98\x80");
  EXPECT_EQ(stream.flush(), "");
  // A sequence that can no longer complete comes out as U+FFFD as soon as that is known, and at flush.
  xmoe::Tokenizer::StreamDecoder broken(tok);
  EXPECT_EQ(broken.push(ids[0]), "");
  EXPECT_EQ(broken.push(*tok.token_to_id("a")),
            "\xEF\xBF\xBD"
            "a");
  EXPECT_EQ(broken.push(ids[0]), "");
  EXPECT_EQ(broken.push(ids[1]), "");
  EXPECT_EQ(broken.flush(), "\xEF\xBF\xBD");
}

TEST(Tokenizer, EncodeIsFastAndThreadSafe) {
  const auto tok = xmoe::Tokenizer::from_file(kDir + "qwen2/tokenizer.json");
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::vector<int32_t>> serial;
  size_t bytes = 0;
  for (const std::string& text : corpus()) {
    serial.push_back(tok.encode(text));
    bytes += text.size();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("[ perf ] encoded %zu strings (%zu bytes) in %.1f ms (%.1f MB/s)\n", corpus().size(), bytes,
              seconds * 1e3, bytes / seconds / 1e6);
  EXPECT_LT(seconds, 5.0);  // well under a second in a release build; generous for sanitizer builds

  std::vector<std::vector<std::vector<int32_t>>> results(4);
  std::vector<std::thread> threads;
  for (auto& result : results) {
    threads.emplace_back([&tok, &result] {
      for (const std::string& text : corpus()) result.push_back(tok.encode(text));
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& result : results) EXPECT_EQ(result, serial);
}

// Malformed tokenizer.json files: the error names the file and the field.
std::string error_of(const std::string& text) {
  try {
    xmoe::Tokenizer::from_json(text, "bad.json");
  } catch (const xmoe::Error& e) {
    return e.what();
  }
  return "(no error)";
}

json tiny_json() {
  return json::parse(read_file(kDir + "tiny-bpe/tokenizer.json"));
}

TEST(Tokenizer, MalformedFilesNameTheField) {
  auto expect_error = [](const json& j, const std::string& needle) {
    const std::string message = error_of(j.dump());
    EXPECT_NE(message.find("bad.json"), std::string::npos) << message;
    EXPECT_NE(message.find(needle), std::string::npos) << "expected '" << needle << "' in: " << message;
  };
  json j = tiny_json();
  j.erase("model");
  expect_error(j, "model: missing");

  j = tiny_json();
  j["model"]["merges"][3] = "a b c";
  expect_error(j, "model.merges[3]");
  j["model"]["merges"][3] = json::array({"a"});
  expect_error(j, "model.merges[3]");
  j["model"]["merges"][3] = "notatoken alsonot";
  expect_error(j, "model.merges[3]");

  j = tiny_json();
  j["model"]["type"] = "WordPiece";
  expect_error(j, "model.type");
  j = tiny_json();
  j["model"]["vocab"]["Ġthe"] = "seven";
  expect_error(j, "model.vocab.Ġthe");
  // One id far beyond the others would size the id table at 300 MB (found by fuzzing); a hole within the
  // bound still loads.
  j = tiny_json();
  j["model"]["vocab"]["Ġthe"] = 9741451;
  expect_error(j, "model.vocab: id 9741451 is too large");
  j = tiny_json();
  j["model"]["vocab"]["Ġthe"] = 200000;
  EXPECT_EQ(xmoe::Tokenizer::from_json(j.dump(), "holes.json").token_to_id("Ġthe"), 200000);

  j = tiny_json();
  j["pre_tokenizer"]["pretokenizers"][1]["type"] = "Metaspace";
  expect_error(j, "pre_tokenizer.pretokenizers[1].type");
  j = tiny_json();
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed[";
  expect_error(j, "pre_tokenizer.pretokenizers[0].pattern.Regex");
  j = tiny_json();
  j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Sideways";
  expect_error(j, "pre_tokenizer.pretokenizers[0].behavior");

  j = tiny_json();
  j["normalizer"] = {{"type", "Precompiled"}};
  expect_error(j, "normalizer.type");
  j = tiny_json();
  j["decoder"] = {{"type", "WordPiece"}};
  expect_error(j, "decoder.type");
  j = tiny_json();
  j["post_processor"] = {{"type", "TemplateProcessing"},
                         {"single", json::array({{{"SpecialToken", {{"id", "X"}}}}})}};
  expect_error(j, "post_processor.single[0].SpecialToken.id");
  j = tiny_json();
  j["added_tokens"][0].erase("content");
  expect_error(j, "added_tokens[0].content");

  EXPECT_NE(error_of("{not json").find("bad.json: invalid JSON"), std::string::npos);
  EXPECT_NE(error_of("[]").find("bad.json"), std::string::npos);
  try {
    xmoe::Tokenizer::from_file(kDir + "no-such-dir/tokenizer.json");
    ADD_FAILURE() << "no error for a missing file";
  } catch (const xmoe::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no-such-dir/tokenizer.json"), std::string::npos) << e.what();
  }
}

}  // namespace
