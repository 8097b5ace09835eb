#include "llm/tokenizer/tiktoken_tokenizer.hpp"

#include <algorithm>
#include <map>
#include <set>

#include "llm/tokenizer/byte_level.hpp"
#include "llm/tokenizer/tiktoken_pattern.hpp"
#include "util/text_file.hpp"
#include "xmoe/error.hpp"
#include "xmoe/tokenizer.hpp"

namespace xmoe {
namespace tokenizer_detail {

bool is_python_space(char32_t cp) {
  // The characters whose bidirectional class is WS, B or S or whose category is Zs (CPython's
  // _PyUnicode_IsWhitespace); tests/llm/test_tiktoken.cpp checks every code point against Python's list.
  if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x1F);
  switch (cp) {
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

namespace {

// tokenizer_config.json's added_tokens_decoder: {"<id>": {"content": ..., "special": ..., ...}, ...}, ids
// below id_limit (the end of the reserved window: the model's vocabulary ends there).
std::map<int32_t, AddedToken> parse_added_tokens_decoder(const Json& config, const JsonPath& root,
                                                         int64_t id_limit) {
  std::map<int32_t, AddedToken> tokens;
  const Json* decoder = optional_field(config, "added_tokens_decoder");
  if (!decoder) return tokens;
  const JsonPath at = root / "added_tokens_decoder";
  XMOE_CHECK(decoder->is_object(), at.str(), ": expected an object of id -> token");
  std::set<std::string> contents;
  for (const auto& [key, entry] : decoder->items()) {
    const JsonPath where = at / key;
    const bool numeric = !key.empty() && key.size() <= 10 &&
                         std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; });
    XMOE_CHECK(numeric, where.str(), ": key is not a token id");
    XMOE_CHECK(std::stoll(key) < id_limit, where.str(), ": id ", key, " is past the ", kReservedSpecialTokens,
               " special ids after the vocabulary (ids end at ", id_limit - 1, ")");
    AddedToken token;
    token.id = static_cast<int32_t>(std::stoll(key));
    token.content = require_string(entry, "content", where);
    XMOE_CHECK(!token.content.empty(), (where / "content").str(), ": empty token");
    XMOE_CHECK(to_valid_utf8(token.content) == token.content, (where / "content").str(), ": not valid UTF-8");
    XMOE_CHECK(contents.insert(token.content).second, (where / "content").str(), ": '", token.content,
               "' is also the content of another id");
    token.single_word = bool_or(entry, "single_word", false, where);
    token.lstrip = bool_or(entry, "lstrip", false, where);
    token.rstrip = bool_or(entry, "rstrip", false, where);
    token.special = bool_or(entry, "special", false, where);
    tokens.emplace(token.id, std::move(token));
  }
  return tokens;
}

// The pre-tokenizer: tokenizer_config.json's "pat_str", else Kimi-K2's pattern (compiled once per process:
// its expansion to tiktoken's Unicode tables is ~110 KB of regex).
Regex pattern_of(const Json& config, const JsonPath& root) {
  const Json* pattern = optional_field(config, "pat_str");
  if (!pattern) {
    static const Regex kimi(expand_unicode_properties(kKimiPattern), "Kimi-K2's pat_str");
    return kimi;
  }
  const JsonPath at = root / "pat_str";
  XMOE_CHECK(pattern->is_string(), at.str(), ": expected a string");
  const std::string written = pattern->get<std::string>();
  Regex(written, at.str());  // an error then quotes the pattern as written, not expanded
  const std::string expanded = expand_unicode_properties(written);
  // Each property class expands to up to ~10 KB: a bound keeps a hostile config from compiling megabytes.
  XMOE_CHECK(expanded.size() <= (size_t{1} << 20), at.str(), ": too many Unicode property classes (",
             expanded.size(), " bytes once expanded, at most 1 MiB)");
  return Regex(expanded, at.str());
}

}  // namespace

TiktokenTokenizer::TiktokenTokenizer(std::string_view model_text, const std::string& model_where,
                                     const Json& config, const std::string& config_where)
    : TiktokenTokenizer(std::make_shared<const TiktokenVocabulary>(model_text, model_where), config,
                        config_where) {}

TiktokenTokenizer::TiktokenTokenizer(std::shared_ptr<const TiktokenVocabulary> vocabulary, const Json& config,
                                     const std::string& config_where)
    : vocabulary_(std::move(vocabulary)), pattern_(pattern_of(config, JsonPath{config_where, ""})) {
  const JsonPath root{config_where, ""};
  XMOE_CHECK(config.is_null() || config.is_object(), config_where,
             ": expected a JSON object at the top level");
  const int32_t first = vocabulary_->size();
  std::map<int32_t, AddedToken> named =
      parse_added_tokens_decoder(config, root, int64_t{first} + kReservedSpecialTokens);
  // HF matches every added_tokens_decoder entry in the text (with its flags); tiktoken then matches the
  // reserved window, where unnamed ids get placeholder names.
  std::vector<AddedToken> tokens;
  for (auto& [id, token] : named) tokens.push_back(token);
  for (int32_t id = first; id < first + kReservedSpecialTokens; ++id) {
    if (named.count(id)) continue;
    AddedToken token;
    token.id = id;
    token.content = "<|reserved_token_" + std::to_string(id) + "|>";
    token.special = true;
    XMOE_CHECK(std::none_of(tokens.begin(), tokens.end(),
                            [&](const AddedToken& t) { return t.content == token.content; }),
               (root / "added_tokens_decoder").str(), ": '", token.content, "' names another id than ", id);
    tokens.push_back(std::move(token));
  }
  specials_ = std::make_unique<AddedVocabulary>(std::move(tokens));
}

std::vector<std::string_view> TiktokenTokenizer::split(std::string_view text) const {
  std::vector<std::string_view> pieces;
  for (const auto& [begin, end] : pattern_.find_all(text)) pieces.push_back(text.substr(begin, end - begin));
  return pieces;
}

std::vector<int32_t> TiktokenTokenizer::encode(std::string_view text, bool /*add_special_tokens*/) const {
  // tokenization_kimi.py adds no BOS/EOS (PreTrainedTokenizer's build_inputs_with_special_tokens), so
  // add_special_tokens changes nothing.
  std::vector<int32_t> ids;
  for (const TextPiece& part : specials_->split(text, nullptr)) {
    if (part.id) {
      ids.push_back(*part.id);
      continue;
    }
    for_each_wrapper_chunk(part.text, [&](std::string_view chunk) {
      for (const auto& [begin, end] : pattern_.find_all(chunk))
        vocabulary_->encode_piece(chunk.substr(begin, end - begin), ids);
    });
  }
  return ids;
}

std::optional<std::string> TiktokenTokenizer::decoded_piece(int32_t id, bool skip_special_tokens) const {
  if (skip_special_tokens && is_special(id)) return std::nullopt;
  // tiktoken's decode_bytes: a rank's bytes, a special token's name.
  if (id >= 0 && id < vocabulary_->size()) return vocabulary_->bytes_of(id);
  if (const AddedToken* token = specials_->by_id(id)) return token->content;
  return std::nullopt;
}

std::optional<int32_t> TiktokenTokenizer::token_to_id(std::string_view token) const {
  if (auto id = specials_->token_to_id(token)) return id;
  // Token strings are the bytes in GPT-2's printable byte-level form, as tokenization_kimi.py's vocabulary.
  if (auto bytes = byte_level_table().decode(token)) return vocabulary_->rank_of(*bytes);
  return std::nullopt;
}

std::string TiktokenTokenizer::id_to_token(int32_t id) const {
  if (const AddedToken* token = specials_->by_id(id)) return token->content;
  if (id >= 0 && id < vocabulary_->size()) return byte_level_table().encode(vocabulary_->bytes_of(id));
  return {};
}

int64_t TiktokenTokenizer::vocab_size() const {
  return std::max<int64_t>(vocabulary_->size() - 1, specials_->max_id()) + 1;
}

}  // namespace tokenizer_detail

Tokenizer Tokenizer::from_tiktoken(std::string_view model_text, const std::string& model_where,
                                   std::string_view config_json, const std::string& config_where) {
  tokenizer_detail::Json config;
  if (!config_json.empty()) {
    try {
      config = tokenizer_detail::Json::parse(config_json);
    } catch (const tokenizer_detail::Json::exception& e) {
      throw Error(config_where + ": invalid JSON: " + e.what());
    }
  }
  return Tokenizer(
      std::make_shared<tokenizer_detail::TiktokenTokenizer>(model_text, model_where, config, config_where));
}

Tokenizer Tokenizer::from_tiktoken_file(const std::string& tiktoken_model_path,
                                        const std::string& tokenizer_config_path) {
  const std::string config =
      tokenizer_config_path.empty() ? std::string() : read_text_file(tokenizer_config_path);
  return from_tiktoken(read_text_file(tiktoken_model_path), tiktoken_model_path, config,
                       tokenizer_config_path);
}

}  // namespace xmoe
