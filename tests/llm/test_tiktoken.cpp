// tiktoken vocabularies against the PyPI `tiktoken` package (fixtures from tools/make_tiktoken_fixtures.py):
// ids of a mixed-script corpus with Kimi-K2's pattern and special tokens, decode and streaming decode, the
// pre-tokenizer's pieces against Python's `regex` module; the heap BPE against tiktoken's plain loop; errors
// on bad files; and a checkpoint that ships tiktoken.model instead of tokenizer.json, end to end.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cli_runner.hpp"
#include "llm/model_bundle.hpp"
#include "llm/tokenizer/tiktoken_pattern.hpp"
#include "llm/tokenizer/tiktoken_tokenizer.hpp"
#include "llm/tokenizer/utf8.hpp"
#include "xmoe/error.hpp"
#include "xmoe/tokenizer.hpp"

namespace {

using nlohmann::json;
namespace fs = std::filesystem;
namespace td = xmoe::tokenizer_detail;

const std::string kDir = std::string(XMOE_TEST_DATA_DIR) + "/tiktoken/";

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << path;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

const json& fixture() {
  static const json j = json::parse(read_file(kDir + "cases.json"));
  return j;
}

const xmoe::Tokenizer& tokenizer() {
  static const xmoe::Tokenizer t =
      xmoe::Tokenizer::from_tiktoken_file(kDir + "tiktoken.model", kDir + "tokenizer_config.json");
  return t;
}

const td::TiktokenTokenizer& detail() {
  static const td::TiktokenTokenizer t(read_file(kDir + "tiktoken.model"), "tiktoken.model",
                                       json::parse(read_file(kDir + "tokenizer_config.json")),
                                       "tokenizer_config.json");
  return t;
}

std::string short_text(const std::string& s) {
  return s.size() > 80 ? s.substr(0, 80) + "...(" + std::to_string(s.size()) + " bytes)" : s;
}

TEST(Tiktoken, IdsMatchTiktokenOnMixedScriptCorpus) {
  const json& cases = fixture()["cases"];
  ASSERT_GE(cases.size(), 80u);
  size_t total_ids = 0;
  for (const json& c : cases) {
    const std::string text = c["text"];
    const auto expected = c["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(tokenizer().encode(text), expected) << short_text(text);
    // Kimi's tokenizer adds no BOS/EOS.
    EXPECT_EQ(tokenizer().encode(text, /*add_special_tokens=*/true), expected) << short_text(text);
    total_ids += expected.size();
  }
  EXPECT_GT(total_ids, 3000u);
}

TEST(Tiktoken, DecodeRoundTripsAndRepairsLikeTiktoken) {
  for (const json& c : fixture()["cases"]) {
    const std::string text = c["text"];
    const auto ids = c["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(tokenizer().decode(ids), text) << short_text(text);
    // Every other id: sequences cut mid-character, which tiktoken's decode (errors="replace") repairs.
    std::vector<int32_t> odd;
    for (size_t i = 1; i < ids.size(); i += 2) odd.push_back(ids[i]);
    EXPECT_EQ(tokenizer().decode(odd), c["decoded_odd"].get<std::string>()) << short_text(text);
    // Streaming gives the same text as decoding at once, holding incomplete characters back.
    for (const std::vector<int32_t>* list : {&ids, static_cast<const std::vector<int32_t>*>(&odd)}) {
      xmoe::Tokenizer::StreamDecoder stream(tokenizer());
      std::string streamed;
      for (int32_t id : *list) {
        const std::string piece = stream.push(id);
        EXPECT_EQ(td::to_valid_utf8(piece), piece) << "streamed piece is not valid UTF-8";
        streamed += piece;
      }
      streamed += stream.flush();
      EXPECT_EQ(streamed, tokenizer().decode(*list)) << short_text(text);
    }
  }
}

TEST(Tiktoken, PiecesMatchPythonRegexModule) {
  size_t checked = 0;
  for (const json& c : fixture()["cases"]) {
    if (!c.contains("pieces")) continue;
    const std::string text = c["text"];
    std::vector<std::string> pieces;
    for (std::string_view p : detail().split(text)) pieces.emplace_back(p);
    EXPECT_EQ(pieces, c["pieces"].get<std::vector<std::string>>()) << short_text(text);
    ++checked;
  }
  EXPECT_GT(checked, 60u);
}

TEST(Tiktoken, HeapMergeEqualsTiktokensPlainLoop) {
  const td::TiktokenVocabulary& v = detail().vocabulary();
  auto compare = [&](std::string_view piece) {
    std::vector<int32_t> fast, reference;
    v.encode_piece(piece, fast);
    v.encode_piece_reference(piece, reference);
    EXPECT_EQ(fast, reference) << short_text(std::string(piece));
  };
  for (const json& c : fixture()["cases"]) {
    const std::string text = c["text"];
    if (text.size() > 2000) continue;
    for (std::string_view p : detail().split(text)) compare(p);
  }
  // Random strings over a small alphabet of frequent tokens' bytes: long pieces with many equal-rank ties.
  std::mt19937 rng(7);
  const std::vector<std::string> alphabet = {"a", "aa", " ", "e", "th", "the", "in", "的", "ing", "\n", "x"};
  for (int trial = 0; trial < 300; ++trial) {
    std::string s;
    const int n = 1 + static_cast<int>(rng() % 60);
    for (int i = 0; i < n; ++i) s += alphabet[rng() % alphabet.size()];
    compare(s);
  }
}

TEST(Tiktoken, WrapperChunksAtPythonWhitespace) {
  // Python's str.isspace() over every code point (the fixture lists where it is true).
  const auto spaces = fixture()["python_isspace"].get<std::vector<uint32_t>>();
  size_t k = 0;
  for (char32_t cp = 0; cp < 0x110000; ++cp) {
    const bool expected = k < spaces.size() && spaces[k] == cp;
    if (expected) ++k;
    ASSERT_EQ(td::is_python_space(cp), expected) << std::hex << static_cast<uint32_t>(cp);
  }
  // Runs longer than 25,000 characters are cut (the corpus checks the ids; here the cut points).
  std::vector<std::string_view> chunks;
  const std::string text = std::string(25'001, 'a') + "  " + std::string(50'001, 'b');
  td::for_each_wrapper_chunk(text, [&](std::string_view c) { chunks.push_back(c); });
  ASSERT_EQ(chunks.size(), 4u);
  EXPECT_EQ(chunks[0], std::string(25'000, 'a'));
  EXPECT_EQ(chunks[1], "a  " + std::string(25'000, 'b'));
  EXPECT_EQ(chunks[2].size(), 25'000u);
  EXPECT_EQ(chunks[3], std::string(1, 'b'));
}

TEST(Tiktoken, UnicodePropertiesAreTiktokens) {
  // Escapes other than a tabled property stay as written (an escaped backslash before "p{L}" included).
  EXPECT_EQ(td::expand_unicode_properties(R"(a\\p{L}\p{Greek}\d)"), R"(a\\p{L}\p{Greek}\d)");
  const std::string han = td::expand_unicode_properties(R"([^\p{Han}])");
  EXPECT_EQ(han.substr(0, 3), "[^[");
  EXPECT_NE(han.find(R"(\x{4E00}-)"), std::string::npos);
  // U+31350 (CJK Extension H, Unicode 15) is Han and a letter for tiktoken, whatever Oniguruma's tables say.
  const td::Regex letters(td::expand_unicode_properties(R"(\p{Han}+|\P{L}+)"), "test");
  const std::string text = "\xF0\xB1\x8D\x90\xF0\xB1\x8D\x91 \xE4\xB8\x80";
  const auto matches = letters.find_all(text);
  ASSERT_EQ(matches.size(), 3u);
  EXPECT_EQ(matches[0], std::make_pair(size_t{0}, size_t{8}));
  EXPECT_EQ(matches[1], std::make_pair(size_t{8}, size_t{9}));
}

TEST(Tiktoken, SpecialTokensAndVocabulary) {
  const xmoe::Tokenizer& t = tokenizer();
  const int32_t base = fixture()["num_base_tokens"];
  EXPECT_EQ(t.vocab_size(), base + 256);
  EXPECT_EQ(t.token_to_id("[BOS]"), base);
  EXPECT_EQ(t.token_to_id("[EOS]"), base + 1);
  EXPECT_EQ(t.token_to_id("<|im_end|>"), base + 2);
  EXPECT_EQ(t.token_to_id("[PAD]"), base + 255);
  const std::string reserved = "<|reserved_token_" + std::to_string(base + 5) + "|>";
  EXPECT_EQ(t.id_to_token(base + 5), reserved);
  EXPECT_EQ(t.token_to_id(reserved), base + 5);
  EXPECT_TRUE(t.is_special(base + 5));
  EXPECT_TRUE(t.is_special(base + 2));
  EXPECT_FALSE(t.is_special(base + 22));  // <think>: added, not special
  EXPECT_FALSE(t.is_special(65));
  // Ordinary tokens read as GPT-2's printable byte-level strings, as tokenization_kimi.py shows them.
  EXPECT_EQ(t.id_to_token(65), "A");
  EXPECT_EQ(t.id_to_token(32), "\xC4\xA0");  // "Ġ"
  EXPECT_EQ(t.token_to_id("\xC4\xA0"), 32);
  EXPECT_EQ(t.id_to_token(base + 256), "");
  const std::vector<int32_t> ids = {base + 3, 72, base + 22, base + 2, -1, base + 999};
  EXPECT_EQ(t.decode(ids), "<|im_user|>H<think><|im_end|>");
  EXPECT_EQ(t.decode(ids, /*skip_special_tokens=*/true), "H<think>");
}

std::string vocabulary_with(const std::string& extra_lines) {
  std::string text;
  for (int b = 0; b < 256; ++b) {
    static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const auto c = static_cast<unsigned>(b);
    text +=
        std::string{kAlphabet[c >> 2], kAlphabet[(c & 3) << 4], '=', '='} + " " + std::to_string(b) + "\n";
  }
  return text + extra_lines;
}

std::string load_error(const std::string& model_text, const std::string& config = "") {
  try {
    xmoe::Tokenizer::from_tiktoken(model_text, "dir/tiktoken.model", config, "dir/tokenizer_config.json");
  } catch (const xmoe::Error& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(Tiktoken, BadFilesGiveErrorsNamingFileLineAndProblem) {
  EXPECT_NO_THROW(xmoe::Tokenizer::from_tiktoken(vocabulary_with("YWI= 256\r\n\nYWJj 257"), "m", "", "c"));
  const struct {
    std::string text, expected;
  } cases[] = {
      {vocabulary_with("YW!= 256\n"), "dir/tiktoken.model:257: bad base64 'YW!=': character '!' at column 3"},
      {vocabulary_with("YWJ 256\n"), "dir/tiktoken.model:257: bad base64 'YWJ': length 3"},
      {vocabulary_with("==== 256\n"), "dir/tiktoken.model:257: bad base64"},
      {vocabulary_with("YWI= 3\n"), "dir/tiktoken.model:257: duplicate rank 3 (also on line 4)"},
      {vocabulary_with("YWI= 256\nYWI= 257\n"),
       "dir/tiktoken.model:258: duplicate token 'ab' (also rank 256"},
      {vocabulary_with("YWI= 300\n"),
       "dir/tiktoken.model: ranks are not 0..256 (257 tokens): rank 256 is missing"},
      {vocabulary_with("YWI= -4\n"), "dir/tiktoken.model:257: rank '-4' is not a non-negative integer"},
      {vocabulary_with("YWI= 99999999999\n"), "dir/tiktoken.model:257: rank '99999999999' is not"},
      {vocabulary_with("YWI= 1073741824\n"), "rank 1073741824 is too large"},
      {vocabulary_with("YWI=\n"), "dir/tiktoken.model:257: expected '<base64 token> <rank>', got 'YWI='"},
      {vocabulary_with("YWI= 256 x\n"), "dir/tiktoken.model:257: expected '<base64 token> <rank>'"},
      {vocabulary_with(std::string(5000, 'Q') + " 256\n"), "dir/tiktoken.model:257: line is 5004 bytes long"},
      {"", "dir/tiktoken.model: no tokens"},
      {"QQ== 0\n", "dir/tiktoken.model: no token for the byte 0x\\x00 (0)"},
  };
  for (const auto& c : cases) {
    const std::string error = load_error(c.text);
    EXPECT_NE(error.find(c.expected), std::string::npos) << "got: " << error << "\nexpected: " << c.expected;
  }
  const std::string good = vocabulary_with("");
  EXPECT_NE(load_error(good, "{").find("dir/tokenizer_config.json: invalid JSON"), std::string::npos);
  EXPECT_NE(load_error(good, R"({"added_tokens_decoder": {"x": {"content": "a"}}})")
                .find("dir/tokenizer_config.json: added_tokens_decoder.x: key is not a token id"),
            std::string::npos);
  EXPECT_NE(
      load_error(good, R"({"added_tokens_decoder": {"512": {"content": "<a>"}}})")
          .find("added_tokens_decoder.512: id 512 is past the 256 special ids after the vocabulary (ids end "
                "at 511)"),
      std::string::npos);
  EXPECT_NE(load_error(good, R"({"added_tokens_decoder": {"300": {"special": true}}})")
                .find("added_tokens_decoder.300.content: missing"),
            std::string::npos);
  EXPECT_NE(
      load_error(good, R"({"added_tokens_decoder": {"300": {"content": "<a>"}, "301": {"content": "<a>"}}})")
          .find("'<a>' is also the content of another id"),
      std::string::npos);
  EXPECT_NE(load_error(good, R"({"pat_str": "(unclosed"})")
                .find("dir/tokenizer_config.json: pat_str: invalid regex"),
            std::string::npos);
  std::string many_properties;
  for (int i = 0; i < 200; ++i) many_properties += "\\\\p{L}";
  EXPECT_NE(load_error(good, R"({"pat_str": ")" + many_properties + "\"}")
                .find("pat_str: too many Unicode property classes"),
            std::string::npos);
  const std::string missing = load_error(good, "");
  EXPECT_EQ(missing, "<no error>");
  try {
    xmoe::Tokenizer::from_tiktoken_file("/nonexistent/tiktoken.model", "");
    ADD_FAILURE() << "no error";
  } catch (const xmoe::Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/tiktoken.model"), std::string::npos) << e.what();
  }
}

TEST(Tiktoken, OtherPatternFromTokenizerConfig) {
  // A config may name its own pattern: here every character is a piece, so nothing merges.
  const xmoe::Tokenizer t =
      xmoe::Tokenizer::from_tiktoken(vocabulary_with("YWI= 256\n"), "m", R"({"pat_str": "."})", "c");
  EXPECT_EQ(t.encode("abab"), (std::vector<int32_t>{97, 98, 97, 98}));
  const xmoe::Tokenizer kimi = xmoe::Tokenizer::from_tiktoken(vocabulary_with("YWI= 256\n"), "m", "", "c");
  EXPECT_EQ(kimi.encode("abab"), (std::vector<int32_t>{256, 256}));
  EXPECT_EQ(kimi.vocab_size(), 257 + 256);
}

// A checkpoint with tiktoken.model + tokenizer_config.json and no tokenizer.json: ModelBundle picks the
// tiktoken vocabulary and `xmoe generate` runs on it.
TEST(Tiktoken, CheckpointWithTiktokenModelGenerates) {
  const fs::path dir = fs::temp_directory_path() / ("xmoe_tiktoken_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  json cfg = json::parse(read_file(std::string(XMOE_TEST_DATA_DIR) + "/models/untied-yarn/config.json"));
  const int32_t base = fixture()["num_base_tokens"];
  cfg["vocab_size"] = base + 256;
  cfg["eos_token_id"] = base + 1;
  std::ofstream(dir / "config.json") << cfg.dump(2);
  const auto init = xmoe::testing_cli::run_cli("init-model --config " + (dir / "config.json").string() +
                                               " --out " + (dir / "model").string() + " --dtype f32");
  ASSERT_EQ(init.code, 0) << init.output;
  const fs::path model = dir / "model";
  fs::remove(model / "tokenizer.json");
  fs::copy_file(kDir + "tiktoken.model", model / "tiktoken.model");
  fs::copy_file(kDir + "tokenizer_config.json", model / "tokenizer_config.json",
                fs::copy_options::overwrite_existing);

  const xmoe::llm::ModelBundle bundle = xmoe::llm::ModelBundle::open(model.string());
  ASSERT_TRUE(bundle.tokenizer.has_value());
  const json& c = fixture()["cases"][0];
  EXPECT_EQ(bundle.tokenizer->encode(c["text"].get<std::string>()), c["ids"].get<std::vector<int32_t>>());
  EXPECT_EQ(bundle.chat.eos_token, "[EOS]");
  EXPECT_NE(std::find(bundle.chat.eos_token_ids.begin(), bundle.chat.eos_token_ids.end(), base + 1),
            bundle.chat.eos_token_ids.end());

  const auto run =
      xmoe::testing_cli::run_cli("generate --model " + model.string() +
                                 " --prompt '你好, world' --max-tokens 4 --ignore-eos --dtype f32 "
                                 "--print-ids");
  EXPECT_EQ(run.code, 0) << run.output;
  EXPECT_NE(run.output.find("generated ids: "), std::string::npos) << run.output;
  fs::remove_all(dir);
}

// `init-model --vocab-format tiktoken` (the default of an architecture whose InitModelSpec asks for it)
// writes tiktoken.model + tokenizer_config.json that load back, with the architecture's special tokens in the
// reserved ids and config.json's eos pointing at them.
TEST(Tiktoken, InitModelWritesTiktokenVocabulary) {
  const fs::path dir = fs::temp_directory_path() / ("xmoe_tiktoken_init_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  json cfg = json::parse(read_file(std::string(XMOE_TEST_DATA_DIR) + "/models/untied-yarn/config.json"));
  cfg["vocab_size"] = 1000;
  std::ofstream(dir / "config.json") << cfg.dump(2);
  const fs::path model = dir / "model";
  const auto init =
      xmoe::testing_cli::run_cli("init-model --config " + (dir / "config.json").string() + " --out " +
                                 model.string() + " --dtype f32 --vocab-format tiktoken");
  ASSERT_EQ(init.code, 0) << init.output;
  EXPECT_FALSE(fs::exists(model / "tokenizer.json"));
  ASSERT_TRUE(fs::exists(model / "tiktoken.model"));
  const xmoe::Tokenizer t = xmoe::Tokenizer::from_tiktoken_file((model / "tiktoken.model").string(),
                                                                (model / "tokenizer_config.json").string());
  EXPECT_EQ(t.vocab_size(), 1000);
  const json written = json::parse(read_file((model / "config.json").string()));
  const auto im_end = t.token_to_id("<|im_end|>");
  ASSERT_TRUE(im_end.has_value());
  EXPECT_GE(*im_end, 1000 - 256);
  EXPECT_TRUE(t.is_special(*im_end));
  EXPECT_EQ(written["eos_token_id"], *im_end);
  EXPECT_EQ(t.id_to_token(999), "<|reserved_token_999|>");
  const std::string text = "Hello, world! The model thinks. 你好";
  const auto ids = t.encode(text);
  EXPECT_LT(ids.size(), text.size());  // seed words merge
  EXPECT_EQ(t.decode(ids), text);
  const auto run =
      xmoe::testing_cli::run_cli("generate --model " + model.string() +
                                 " --prompt 'Hello, world' --max-tokens 3 --ignore-eos --dtype f32");
  EXPECT_EQ(run.code, 0) << run.output;
  // Too small a vocabulary for 256 bytes and 256 reserved ids: no tokenizer, said so.
  cfg["vocab_size"] = 400;
  std::ofstream(dir / "config.json") << cfg.dump(2);
  const auto small =
      xmoe::testing_cli::run_cli("init-model --config " + (dir / "config.json").string() + " --out " +
                                 (dir / "small").string() + " --vocab-format tiktoken");
  EXPECT_EQ(small.code, 0) << small.output;
  EXPECT_NE(small.output.find("no tokenizer written"), std::string::npos) << small.output;
  EXPECT_FALSE(fs::exists(dir / "small" / "tiktoken.model"));
  fs::remove_all(dir);
}

}  // namespace
