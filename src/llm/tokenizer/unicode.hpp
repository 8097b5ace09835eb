// Unicode normalization forms and character classes (ICU), with the semantics HF tokenizers gets from Rust.
#pragma once
#include <string>
#include <string_view>

namespace xmoe::tokenizer_detail {

enum class NormalForm { kNFC, kNFD, kNFKC, kNFKD };

std::string normalize_unicode(std::string_view text, NormalForm form);  // text: valid UTF-8
// Each character replaced by its full lowercase mapping on its own (no context), as Rust's
// char::to_lowercase.
std::string lowercase_each_char(std::string_view text);
bool is_whitespace(char32_t cp);    // Rust char::is_whitespace: the White_Space property
bool is_alphanumeric(char32_t cp);  // Rust char::is_alphanumeric: Alphabetic or Numeric (Nd, Nl, No)

}  // namespace xmoe::tokenizer_detail
