// GPT-2's reversible byte ↔ printable-character table (bytes_to_unicode), used by the ByteLevel
// pre-tokenizer and decoder.
#pragma once
#include <array>
#include <optional>
#include <string>
#include <string_view>

namespace xmoe::tokenizer_detail {

class ByteLevelTable {
 public:
  ByteLevelTable();
  // Each byte of text replaced by the UTF-8 of its printable character.
  std::string encode(std::string_view text) const;
  // The bytes a token stands for, or nullopt when a character of it is not in the table (HF then keeps the
  // token's own bytes).
  std::optional<std::string> decode(std::string_view token) const;

 private:
  std::array<std::string, 256> byte_to_utf8_;
  std::array<int, 324> code_point_to_byte_;  // the table's characters are all below U+0144; -1 = none
};

const ByteLevelTable& byte_level_table();

}  // namespace xmoe::tokenizer_detail
