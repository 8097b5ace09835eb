#include "llm/tokenizer/tiktoken_pattern.hpp"

#include <cstdio>

#include "llm/tokenizer/tiktoken_unicode_tables.hpp"

namespace xmoe::tokenizer_detail {
namespace {

const tiktoken_unicode::Property* find_property(std::string_view name) {
  for (const auto& property : tiktoken_unicode::kProperties)
    if (property.name == name) return &property;
  return nullptr;
}

void append_code_point(std::string& out, char32_t cp) {
  char buffer[16];
  std::snprintf(buffer, sizeof buffer, "\\x{%X}", static_cast<unsigned>(cp));
  out += buffer;
}

}  // namespace

std::string expand_unicode_properties(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size());
  size_t i = 0;
  while (i < pattern.size()) {
    if (pattern[i] != '\\' || i + 1 >= pattern.size()) {
      out += pattern[i++];
      continue;
    }
    const char kind = pattern[i + 1];
    if ((kind == 'p' || kind == 'P') && i + 2 < pattern.size() && pattern[i + 2] == '{') {
      const size_t close = pattern.find('}', i + 3);
      if (close != std::string_view::npos) {
        if (const auto* property = find_property(pattern.substr(i + 3, close - i - 3))) {
          out += kind == 'P' ? "[^" : "[";
          for (const auto& range : property->ranges) {
            append_code_point(out, range.first);
            if (range.last != range.first) {
              out += '-';
              append_code_point(out, range.last);
            }
          }
          out += ']';
          i = close + 1;
          continue;
        }
      }
    }
    out.append(pattern.substr(i, 2));  // any other escape, kept whole so "\\p{L}" stays a literal
    i += 2;
  }
  return out;
}

}  // namespace xmoe::tokenizer_detail
