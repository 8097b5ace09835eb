#include "llm/tokenizer/byte_level.hpp"

#include "llm/tokenizer/utf8.hpp"

namespace xmoe::tokenizer_detail {

ByteLevelTable::ByteLevelTable() {
  code_point_to_byte_.fill(-1);
  int next_extra = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    const int cp = printable ? b : next_extra++;
    append_utf8(byte_to_utf8_[b], static_cast<char32_t>(cp));
    code_point_to_byte_[cp] = b;
  }
}

std::string ByteLevelTable::encode(std::string_view text) const {
  std::string out;
  out.reserve(text.size() * 2);
  for (unsigned char b : text) out += byte_to_utf8_[b];
  return out;
}

std::optional<std::string> ByteLevelTable::decode(std::string_view token) const {
  std::string out;
  out.reserve(token.size());
  size_t i = 0;
  while (i < token.size()) {
    if (valid_sequence_length(token, i) == 0) return std::nullopt;
    const char32_t cp = next_code_point(token, i);
    if (cp >= code_point_to_byte_.size() || code_point_to_byte_[cp] < 0) return std::nullopt;
    out += static_cast<char>(code_point_to_byte_[cp]);
  }
  return out;
}

const ByteLevelTable& byte_level_table() {
  static const ByteLevelTable table;  // immutable after construction (thread-safe static init)
  return table;
}

}  // namespace xmoe::tokenizer_detail
