#include "pystr.hpp"

#include <locale.h>
#include <wctype.h>
#include <clocale>
#include <cstdio>
#include <cwctype>

#include "value.hpp"

namespace xmoe::jinja::pystr {

std::u32string decode(const std::string& utf8) {
  std::u32string out;
  out.reserve(utf8.size());
  for (size_t i = 0; i < utf8.size();) {
    const auto c = static_cast<unsigned char>(utf8[i]);
    int extra = c < 0x80 ? 0 : (c >> 5) == 0x6 ? 1 : (c >> 4) == 0xE ? 2 : (c >> 3) == 0x1E ? 3 : -1;
    if (extra < 0 || i + static_cast<size_t>(extra) >= utf8.size())
      fail("UnicodeDecodeError", "invalid UTF-8 in string at byte " + std::to_string(i));
    char32_t cp = extra == 0 ? c : extra == 1 ? (c & 0x1F) : extra == 2 ? (c & 0x0F) : (c & 0x07);
    for (int k = 1; k <= extra; ++k) {
      const auto cc = static_cast<unsigned char>(utf8[i + k]);
      if ((cc >> 6) != 0x2)
        fail("UnicodeDecodeError", "invalid UTF-8 in string at byte " + std::to_string(i));
      cp = (cp << 6) | (cc & 0x3F);
    }
    out.push_back(cp);
    i += extra + 1;
  }
  return out;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string encode(const std::u32string& text) {
  std::string out;
  out.reserve(text.size());
  for (char32_t cp : text) append_utf8(out, cp);
  return out;
}

size_t length(const std::string& utf8) {
  size_t n = 0;
  for (char c : utf8) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

std::optional<size_t> find_invalid_utf8(const std::string& text) {
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    size_t extra;
    char32_t cp, min;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c >> 5) == 0x6) {
      extra = 1, cp = c & 0x1F, min = 0x80;
    } else if ((c >> 4) == 0xE) {
      extra = 2, cp = c & 0x0F, min = 0x800;
    } else if ((c >> 3) == 0x1E) {
      extra = 3, cp = c & 0x07, min = 0x10000;
    } else {
      return i;
    }
    if (i + extra >= text.size()) return i;
    for (size_t k = 1; k <= extra; ++k) {
      const auto cc = static_cast<unsigned char>(text[i + k]);
      if ((cc >> 6) != 0x2) return i;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += extra + 1;
  }
  return std::nullopt;
}

bool is_space(char32_t cp) {
  // The characters CPython's str.isspace() accepts (bidirectional class WS/B/S or category Zs).
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

std::string strip(const std::string& s, const std::optional<std::string>& chars, bool left, bool right) {
  const std::u32string text = decode(s);
  const std::u32string set = chars ? decode(*chars) : std::u32string();
  auto strippable = [&](char32_t cp) { return chars ? set.find(cp) != std::u32string::npos : is_space(cp); };
  size_t begin = 0, end = text.size();
  if (left)
    while (begin < end && strippable(text[begin])) ++begin;
  if (right)
    while (end > begin && strippable(text[end - 1])) --end;
  return encode(text.substr(begin, end - begin));
}

std::vector<std::string> split(const std::string& s, const std::optional<std::string>& sep, long maxsplit) {
  std::vector<std::string> parts;
  if (sep) {
    if (sep->empty()) fail("ValueError", "empty separator");
    size_t pos = 0;
    while (maxsplit < 0 || static_cast<long>(parts.size()) < maxsplit) {
      const size_t hit = s.find(*sep, pos);
      if (hit == std::string::npos) break;
      parts.push_back(s.substr(pos, hit - pos));
      pos = hit + sep->size();
    }
    parts.push_back(s.substr(pos));
    return parts;
  }
  const std::u32string text = decode(s);
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && is_space(text[i])) ++i;
    if (i == text.size()) break;
    if (maxsplit >= 0 && static_cast<long>(parts.size()) == maxsplit) {
      size_t end = text.size();
      while (end > i && is_space(text[end - 1])) --end;
      parts.push_back(encode(text.substr(i, end - i)));
      break;
    }
    size_t j = i;
    while (j < text.size() && !is_space(text[j])) ++j;
    parts.push_back(encode(text.substr(i, j - i)));
    i = j;
  }
  return parts;
}

std::string replace(const std::string& s, const std::string& old, const std::string& with, long count) {
  std::string out;
  if (old.empty()) {
    // Python inserts `with` between every code point (and at both ends).
    const std::u32string text = decode(s);
    long done = 0;
    for (char32_t cp : text) {
      if (count < 0 || done < count) out += with, ++done;
      append_utf8(out, cp);
    }
    if (count < 0 || done < count) out += with;
    return out;
  }
  size_t pos = 0;
  long done = 0;
  while (count < 0 || done < count) {
    const size_t hit = s.find(old, pos);
    if (hit == std::string::npos) break;
    out.append(s, pos, hit - pos);
    out += with;
    pos = hit + old.size();
    ++done;
  }
  out.append(s, pos, std::string::npos);
  return out;
}

namespace {
// Case mapping comes from glibc's C.UTF-8 locale (simple one-to-one mappings, like CPython's for nearly all
// letters; CPython's special cases such as 'ß'.upper() == 'SS' are not reproduced). Without that locale only
// ASCII letters change case.
locale_t utf8_ctype() {
  static const locale_t locale = newlocale(LC_CTYPE_MASK, "C.UTF-8", static_cast<locale_t>(nullptr));
  return locale;
}

std::string map_case(const std::string& s, bool to_upper) {
  const locale_t locale = utf8_ctype();
  std::string out;
  out.reserve(s.size());
  for (char32_t cp : decode(s)) {
    if (cp < 0x80 || !locale) {
      if (to_upper && cp >= 'a' && cp <= 'z') cp -= 'a' - 'A';
      if (!to_upper && cp >= 'A' && cp <= 'Z') cp += 'a' - 'A';
    } else {
      cp = static_cast<char32_t>(to_upper ? towupper_l(static_cast<wint_t>(cp), locale)
                                          : towlower_l(static_cast<wint_t>(cp), locale));
    }
    append_utf8(out, cp);
  }
  return out;
}
}  // namespace

std::string upper(const std::string& s) {
  return map_case(s, true);
}
std::string lower(const std::string& s) {
  return map_case(s, false);
}

namespace {
// CPython's str.isprintable() is false for categories Cc, Cf, Cs, Co, Cn, Zl, Zp and Zs other than ' '. This
// covers the control, format and space characters a chat is likely to hold.
bool is_printable(char32_t cp) {
  if (cp < 0x20 || (cp >= 0x7F && cp <= 0xA0) || cp == 0xAD) return false;
  if (cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200F) || (cp >= 0x2028 && cp <= 0x202F)) return false;
  if ((cp >= 0x205F && cp <= 0x206F) || cp == 0x3000 || cp == 0xFEFF) return false;
  if ((cp >= 0xD800 && cp <= 0xF8FF) || (cp >= 0xFFF9 && cp <= 0xFFFB) || cp >= 0xF0000) return false;
  return true;
}
}  // namespace

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

std::string repr(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (char32_t cp : decode(s)) {
    char buf[16];
    if (cp == static_cast<char32_t>(quote) || cp == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(cp));
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (is_printable(cp)) {
      append_utf8(out, cp);
    } else {
      if (cp < 0x100)
        std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(cp));
      else if (cp < 0x10000)
        std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(cp));
      else
        std::snprintf(buf, sizeof buf, "\\U%08x", static_cast<unsigned>(cp));
      out += buf;
    }
  }
  out.push_back(quote);
  return out;
}

}  // namespace xmoe::jinja::pystr
