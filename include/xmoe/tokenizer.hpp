// BPE tokenizers: a Hugging Face tokenizer.json with HF `tokenizers` semantics, or a tiktoken vocabulary
// (tiktoken.model) with the semantics of the tiktoken package under Kimi-K2's tokenization_kimi.py.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace xmoe {

namespace tokenizer_detail {
struct TokenizerImpl;
}

class Tokenizer {
 public:
  static Tokenizer from_file(const std::string& tokenizer_json_path);  // throws xmoe::Error naming file+field
  static Tokenizer from_json(const std::string& json_text, const std::string& where);
  // tiktoken.model (a base64 token and its rank per line) with tokenizer_config.json beside it (its
  // added_tokens_decoder, and "pat_str" when it names a pre-tokenizer pattern other than Kimi-K2's); the 256
  // ids after the vocabulary are special tokens. tokenizer_config_path may be "" (reserved names only).
  static Tokenizer from_tiktoken_file(const std::string& tiktoken_model_path,
                                      const std::string& tokenizer_config_path);
  // The same from the files' text (config_json may be empty); errors name model_where / config_where.
  static Tokenizer from_tiktoken(std::string_view model_text, const std::string& model_where,
                                 std::string_view config_json, const std::string& config_where);

  // Added/special tokens that appear in the text are matched as in HF tokenizers (their lstrip/rstrip/
  // single_word/normalized flags). add_special_tokens applies the post-processor (e.g. a BOS) when one
  // exists. Text that is not valid UTF-8 is first repaired the way Python's bytes.decode("utf-8", "replace")
  // and Rust's String::from_utf8_lossy do (each maximal invalid subpart becomes U+FFFD), then tokenized.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = false) const;
  // Ids outside the vocabulary are skipped, as HF's decode does. Decoders: ByteLevel and tiktoken (bytes
  // back, then lossy UTF-8 as Rust's from_utf8_lossy) or none (HF then joins the token strings with spaces).
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;
  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::string id_to_token(int32_t id) const;  // "" for an id outside the vocabulary
  int64_t vocab_size() const;                 // largest id + 1 over the vocab and added tokens
  bool is_special(int32_t id) const;

  // Streaming decode: push ids one at a time, get text that is safe to print now. A multi-byte UTF-8
  // character split across tokens is held back until complete; invalid bytes come out as U+FFFD exactly as
  // HF's decode would give them once the sequence is known invalid. flush() returns what is held.
  class StreamDecoder {
   public:
    explicit StreamDecoder(const Tokenizer& t, bool skip_special_tokens = false);
    std::string push(int32_t id);
    std::string flush();

   private:
    std::shared_ptr<const tokenizer_detail::TokenizerImpl> impl_;
    bool skip_special_tokens_;
    bool first_ = true;    // a decoder without a type joins tokens with spaces: none before the first
    std::string pending_;  // bytes of a UTF-8 sequence that may still complete
  };

 private:
  explicit Tokenizer(std::shared_ptr<const tokenizer_detail::TokenizerImpl> impl);
  std::shared_ptr<const tokenizer_detail::TokenizerImpl> impl_;
};

}  // namespace xmoe
