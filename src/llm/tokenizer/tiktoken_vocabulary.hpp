// A tiktoken vocabulary (`tiktoken.model`, OpenAI's `.tiktoken` format): one line per token, the base64 of
// its bytes, a space, its rank. The rank is the token's id and its merge priority: tiktoken's BPE repeatedly
// merges the adjacent pair whose concatenation is the token of lowest rank. Tokens are raw bytes.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "llm/tokenizer/bpe_model.hpp"

namespace xmoe::tokenizer_detail {

class TiktokenVocabulary {
 public:
  // Parses the file's text; errors name `where`, the line and what is wrong (bad base64, a rank that is not
  // a number, a duplicate rank or token, ranks that are not 0..N-1, a missing single-byte token, a line too
  // long to be a token).
  TiktokenVocabulary(std::string_view text, const std::string& where);

  // Appends the ids of one pre-tokenized piece (bytes of valid UTF-8), exactly as tiktoken's
  // byte_pair_encode: the whole piece when it is a token, else merges by lowest rank (leftmost on ties).
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
  // The same merges by the plain loop tiktoken runs (a scan for the minimum after each merge, quadratic);
  // encode_piece uses a heap and must agree with it.
  void encode_piece_reference(std::string_view piece, std::vector<int32_t>& out) const;

  std::optional<int32_t> rank_of(std::string_view bytes) const;
  const std::string& bytes_of(int32_t rank) const { return by_rank_[static_cast<size_t>(rank)]; }
  int32_t size() const { return static_cast<int32_t>(by_rank_.size()); }

 private:
  int32_t require_rank(std::string_view bytes) const;

  TokenMap by_bytes_;
  std::vector<std::string> by_rank_;
};

}  // namespace xmoe::tokenizer_detail
