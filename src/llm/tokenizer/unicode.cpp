#include "llm/tokenizer/unicode.hpp"

#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>
#include <unicode/ustring.h>

#include "llm/tokenizer/utf8.hpp"
#include "xmoe/error.hpp"

namespace xmoe::tokenizer_detail {

std::string normalize_unicode(std::string_view text, NormalForm form) {
  // ASCII is unchanged by every normalization form; most text is ASCII, so skip ICU's UTF-16 round trip.
  bool ascii = true;
  for (char c : text) ascii = ascii && static_cast<unsigned char>(c) < 0x80;
  if (ascii) return std::string(text);
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* normalizer = nullptr;
  switch (form) {
    case NormalForm::kNFC:
      normalizer = icu::Normalizer2::getNFCInstance(status);
      break;
    case NormalForm::kNFD:
      normalizer = icu::Normalizer2::getNFDInstance(status);
      break;
    case NormalForm::kNFKC:
      normalizer = icu::Normalizer2::getNFKCInstance(status);
      break;
    case NormalForm::kNFKD:
      normalizer = icu::Normalizer2::getNFKDInstance(status);
      break;
  }
  XMOE_CHECK(U_SUCCESS(status) && normalizer, "tokenizer: ICU normalizer unavailable: ", u_errorName(status));
  const icu::UnicodeString input = icu::UnicodeString::fromUTF8(icu::StringPiece(text.data(), text.size()));
  if (normalizer->isNormalized(input, status) && U_SUCCESS(status)) return std::string(text);
  status = U_ZERO_ERROR;
  const icu::UnicodeString output = normalizer->normalize(input, status);
  XMOE_CHECK(U_SUCCESS(status), "tokenizer: unicode normalization failed: ", u_errorName(status));
  std::string result;
  output.toUTF8String(result);
  return result;
}

std::string lowercase_each_char(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    const auto b = static_cast<unsigned char>(text[i]);
    if (b < 0x80) {
      out += static_cast<char>(b >= 'A' && b <= 'Z' ? b + 32 : b);
      ++i;
      continue;
    }
    const char32_t cp = next_code_point(text, i);
    UChar source[2];
    int32_t source_length = 0;
    U16_APPEND_UNSAFE(source, source_length, static_cast<UChar32>(cp));
    UChar lowered[8];
    UErrorCode status = U_ZERO_ERROR;
    const int32_t n = u_strToLower(lowered, 8, source, source_length, "", &status);
    if (U_FAILURE(status)) {
      append_utf8(out, cp);
      continue;
    }
    for (int32_t k = 0; k < n;) {
      UChar32 c;
      U16_NEXT_UNSAFE(lowered, k, c);
      append_utf8(out, static_cast<char32_t>(c));
    }
  }
  return out;
}

bool is_whitespace(char32_t cp) {
  return u_isUWhiteSpace(static_cast<UChar32>(cp));
}

bool is_alphanumeric(char32_t cp) {
  const auto c = static_cast<UChar32>(cp);
  if (u_isUAlphabetic(c)) return true;
  const int8_t type = u_charType(c);
  return type == U_DECIMAL_DIGIT_NUMBER || type == U_LETTER_NUMBER || type == U_OTHER_NUMBER;
}

}  // namespace xmoe::tokenizer_detail
