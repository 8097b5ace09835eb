#include "llm/tokenizer/utf8.hpp"

namespace xmoe::tokenizer_detail {
namespace {

// Lead byte → (sequence length, allowed range of the second byte), per Unicode Table 3-7.
struct LeadInfo {
  int length;
  unsigned char second_lo, second_hi;
};

LeadInfo lead_info(unsigned char b) {
  if (b < 0x80) return {1, 0, 0};
  if (b >= 0xC2 && b <= 0xDF) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) return {3, 0x80, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};  // excludes surrogates
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};  // C0, C1, F5..FF and continuation bytes never start a sequence
}

// Number of bytes from s[i] that are a valid prefix of a sequence, and the sequence's full length.
void scan(std::string_view s, size_t i, size_t& prefix, int& length) {
  const auto b = static_cast<unsigned char>(s[i]);
  const LeadInfo info = lead_info(b);
  length = info.length;
  if (info.length <= 1) {
    prefix = 1;
    return;
  }
  prefix = 1;
  for (int k = 1; k < info.length; ++k) {
    if (i + k >= s.size()) return;
    const auto c = static_cast<unsigned char>(s[i + k]);
    const bool ok = k == 1 ? (c >= info.second_lo && c <= info.second_hi) : (c >= 0x80 && c <= 0xBF);
    if (!ok) return;
    ++prefix;
  }
}

}  // namespace

size_t valid_sequence_length(std::string_view s, size_t i) {
  size_t prefix = 0;
  int length = 0;
  scan(s, i, prefix, length);
  return length > 0 && prefix == static_cast<size_t>(length) ? prefix : 0;
}

size_t maximal_prefix_length(std::string_view s, size_t i) {
  size_t prefix = 0;
  int length = 0;
  scan(s, i, prefix, length);
  return prefix;
}

std::string to_valid_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const size_t n = valid_sequence_length(s, i);
    if (n > 0) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      out.append(kReplacementChar);
      i += maximal_prefix_length(s, i);
    }
  }
  return out;
}

size_t incomplete_tail_length(std::string_view s) {
  // A sequence is at most 4 bytes, so only a lead byte among the last 3 can start an incomplete one.
  const size_t first = s.size() >= 3 ? s.size() - 3 : 0;
  for (size_t i = s.size(); i-- > first;) {
    const auto b = static_cast<unsigned char>(s[i]);
    if (b >= 0x80 && b <= 0xBF) continue;  // continuation byte: keep looking for its lead
    size_t prefix = 0;
    int length = 0;
    scan(s, i, prefix, length);
    const size_t rest = s.size() - i;
    return length > 1 && prefix == rest && rest < static_cast<size_t>(length) ? rest : 0;
  }
  return 0;
}

char32_t next_code_point(std::string_view s, size_t& i) {
  const auto b = static_cast<unsigned char>(s[i]);
  if (b < 0x80) {
    ++i;
    return b;
  }
  const int n = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
  char32_t cp = b & (0x7F >> n);
  for (int k = 1; k < n && i + k < s.size(); ++k)
    cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  i += n;
  return cp;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

}  // namespace xmoe::tokenizer_detail
