// What the Tokenizer facade (include/xmoe/tokenizer.hpp) runs on: one implementation per vocabulary format
// (tokenizer.json pipelines, tiktoken vocabularies). The facade repairs input to valid UTF-8 and assembles
// decoded text; an implementation maps between that text and ids.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace xmoe::tokenizer_detail {

struct TokenizerImpl {
  virtual ~TokenizerImpl() = default;
  // text is valid UTF-8.
  virtual std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const = 0;
  // The bytes one id contributes to decoded text (not yet UTF-8 repaired: a token may hold part of a
  // character); nullopt when the id is outside the vocabulary or skipped as special.
  virtual std::optional<std::string> decoded_piece(int32_t id, bool skip_special_tokens) const = 0;
  // HF joins the token strings with " " when a tokenizer.json has no decoder.
  virtual bool joins_pieces_with_spaces() const { return false; }
  virtual std::optional<int32_t> token_to_id(std::string_view token) const = 0;
  virtual std::string id_to_token(int32_t id) const = 0;  // "" when outside the vocabulary
  virtual int64_t vocab_size() const = 0;
  virtual bool is_special(int32_t id) const = 0;
};

}  // namespace xmoe::tokenizer_detail
