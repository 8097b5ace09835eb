// UTF-8 helpers with the exact error policy of Rust's String::from_utf8_lossy (and Python's "replace"):
// every maximal subpart of an ill-formed sequence becomes one U+FFFD.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace xmoe::tokenizer_detail {

inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";

// Length of the well-formed sequence starting at s[i], or 0 if it is ill-formed or cut off by the end of s.
size_t valid_sequence_length(std::string_view s, size_t i);

// Length of the maximal subpart starting at s[i] that is a prefix of a well-formed sequence (at least 1).
// Equal to valid_sequence_length when the sequence is complete and valid.
size_t maximal_prefix_length(std::string_view s, size_t i);

// s with every maximal ill-formed subpart replaced by U+FFFD.
std::string to_valid_utf8(std::string_view s);

// Number of bytes at the end of s that form an incomplete but so far valid UTF-8 sequence: they may still
// become a character when more bytes arrive (0 when s ends on a character boundary or on an invalid byte).
size_t incomplete_tail_length(std::string_view s);

// Decodes the code point at s[i] (s valid UTF-8) and advances i past it.
char32_t next_code_point(std::string_view s, size_t& i);
void append_utf8(std::string& out, char32_t cp);

}  // namespace xmoe::tokenizer_detail
