// A tokenizer over a tiktoken vocabulary, as Kimi-K2's tokenization_kimi.py runs it: special tokens matched
// as whole strings first (tokenizer_config.json's added_tokens_decoder and 256 reserved ids after the
// vocabulary), the text between them cut into the chunks that wrapper hands tiktoken, each chunk split by the
// pre-tokenizer pattern (pat_str) and every piece byte-pair encoded by rank.
#pragma once
#include <memory>
#include <string>
#include <string_view>

#include "llm/tokenizer/added_vocabulary.hpp"
#include "llm/tokenizer/json_fields.hpp"
#include "llm/tokenizer/regex.hpp"
#include "llm/tokenizer/tiktoken_vocabulary.hpp"
#include "llm/tokenizer/tokenizer_impl.hpp"
#include "llm/tokenizer/utf8.hpp"

namespace xmoe::tokenizer_detail {

// Kimi-K2's pat_str (tokenization_kimi.py), the pattern used unless tokenizer_config.json names another in
// "pat_str". Oniguruma reads it as the Rust regex crate under tiktoken does: `&&` intersects classes,
// \p{Han} is the Han script (not script extensions), (?i:...) folds case; the Unicode properties are
// expanded to tiktoken's own tables first (tiktoken_pattern.hpp).
inline constexpr std::string_view kKimiPattern =
    R"([\p{Han}]+)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|\p{N}{1,3})"
    R"(| ?[^\s\p{L}\p{N}]+[\r\n]*)"
    R"(|\s*[\r\n]+)"
    R"(|\s+(?!\S))"
    R"(|\s+)";

// tokenization_kimi.py's num_reserved_special_tokens: ids vocabulary size .. +255 are special tokens, named
// by added_tokens_decoder or "<|reserved_token_{id}|>".
inline constexpr int32_t kReservedSpecialTokens = 256;

// Python's str.isspace(), which decides the whitespace runs the wrapper cuts at.
bool is_python_space(char32_t cp);

// The pieces tokenization_kimi.py's encode hands tiktoken: 400,000-character slices, each cut wherever a run
// of whitespace or of non-whitespace characters would exceed 25,000 (tiktoken's recursion limit). Calls
// `piece` with each (text valid UTF-8; an empty text gives one empty piece).
template <class Fn>
void for_each_wrapper_chunk(std::string_view text, Fn&& piece);

class TiktokenTokenizer final : public TokenizerImpl {
 public:
  // config: tokenizer_config.json's object, or null when the checkpoint has none (then the specials are the
  // reserved names only).
  TiktokenTokenizer(std::string_view model_text, const std::string& model_where, const Json& config,
                    const std::string& config_where);
  // Over a vocabulary already parsed, which tokenizers with different configs may share (the fuzz target
  // varies the config over one vocabulary without parsing it again per input).
  TiktokenTokenizer(std::shared_ptr<const TiktokenVocabulary> vocabulary, const Json& config,
                    const std::string& config_where);

  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const override;
  std::optional<std::string> decoded_piece(int32_t id, bool skip_special_tokens) const override;
  std::optional<int32_t> token_to_id(std::string_view token) const override;
  std::string id_to_token(int32_t id) const override;
  int64_t vocab_size() const override;
  bool is_special(int32_t id) const override { return specials_->is_special(id); }

  // The pre-tokenizer's pieces of one chunk of text (tests compare them with the regex oracle).
  std::vector<std::string_view> split(std::string_view text) const;
  const TiktokenVocabulary& vocabulary() const { return *vocabulary_; }

 private:
  std::shared_ptr<const TiktokenVocabulary> vocabulary_;
  Regex pattern_;
  std::unique_ptr<AddedVocabulary> specials_;
};

template <class Fn>
void for_each_wrapper_chunk(std::string_view text, Fn&& piece) {
  constexpr size_t kMaxChars = 400'000, kMaxRun = 25'000;
  // Character starts: one UTF-8 lead byte each.
  auto is_lead = [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; };
  size_t slice_begin = 0;
  while (true) {
    size_t slice_end = slice_begin, chars = 0;
    while (slice_end < text.size() && chars < kMaxChars) {
      ++slice_end;
      while (slice_end < text.size() && !is_lead(text[slice_end])) ++slice_end;
      ++chars;
    }
    // _split_whitespaces_or_nonwhitespaces over [slice_begin, slice_end).
    size_t start = slice_begin, run = 0;
    bool run_is_space = false;
    for (size_t i = slice_begin; i < slice_end;) {
      size_t next = i + 1;
      while (next < slice_end && !is_lead(text[next])) ++next;
      size_t decode_at = i;
      const bool space = is_python_space(next_code_point(text, decode_at));
      if (i == slice_begin) run_is_space = space;
      if (space != run_is_space) {
        run = 1;
        run_is_space = space;
      } else if (++run > kMaxRun) {
        piece(text.substr(start, i - start));
        start = i;
        run = 1;
      }
      i = next;
    }
    piece(text.substr(start, slice_end - start));
    if (slice_end >= text.size()) break;
    slice_begin = slice_end;
  }
}

}  // namespace xmoe::tokenizer_detail
