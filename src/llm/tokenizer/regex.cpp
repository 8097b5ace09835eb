#include "llm/tokenizer/regex.hpp"

#include <oniguruma.h>

#include <memory>
#include <mutex>

#include "llm/tokenizer/utf8.hpp"
#include "xmoe/error.hpp"

namespace xmoe::tokenizer_detail {
namespace {

void initialize_oniguruma() {
  static std::once_flag once;
  std::call_once(once, [] {
    OnigEncoding encodings[] = {ONIG_ENCODING_UTF8};
    onig_initialize(encodings, 1);
  });
}

std::string onig_message(int code, OnigErrorInfo* info) {
  OnigUChar buffer[ONIG_MAX_ERROR_MESSAGE_LEN];
  const int n = info ? onig_error_code_to_str(buffer, code, info) : onig_error_code_to_str(buffer, code);
  return std::string(reinterpret_cast<const char*>(buffer), n > 0 ? n : 0);
}

}  // namespace

Regex::Regex(const std::string& pattern, const std::string& where) {
  initialize_oniguruma();
  XMOE_CHECK(to_valid_utf8(pattern) == pattern, where, ": regex is not valid UTF-8");
  OnigRegex raw = nullptr;
  OnigErrorInfo info{};
  const auto* begin = reinterpret_cast<const OnigUChar*>(pattern.data());
  const int rc = onig_new(&raw, begin, begin + pattern.size(), ONIG_OPTION_NONE, ONIG_ENCODING_UTF8,
                          ONIG_SYNTAX_RUBY, &info);
  XMOE_CHECK(rc == ONIG_NORMAL, where, ": invalid regex '", pattern, "': ", onig_message(rc, &info));
  regex_ = std::shared_ptr<void>(raw, [](void* r) { onig_free(static_cast<OnigRegex>(r)); });
}

std::vector<std::pair<size_t, size_t>> Regex::find_all(std::string_view text) const {
  std::vector<std::pair<size_t, size_t>> matches;
  auto* regex = static_cast<OnigRegex>(regex_.get());
  std::unique_ptr<OnigRegion, void (*)(OnigRegion*)> region(onig_region_new(),
                                                            [](OnigRegion* r) { onig_region_free(r, 1); });
  const auto* begin = reinterpret_cast<const OnigUChar*>(text.data());
  const auto* end = begin + text.size();
  size_t start = 0;
  bool have_last = false;
  size_t last_end = 0;
  while (start <= text.size()) {
    const int pos = onig_search(regex, begin, end, begin + start, end, region.get(), ONIG_OPTION_NONE);
    if (pos == ONIG_MISMATCH) break;
    XMOE_CHECK(pos >= 0, "tokenizer regex search failed: ", onig_message(pos, nullptr));
    const auto match_begin = static_cast<size_t>(region->beg[0]);
    const auto match_end = static_cast<size_t>(region->end[0]);
    if (match_begin == match_end && have_last && match_end == last_end) {
      // An empty match right after the previous match: step over one character and search again.
      const size_t step = start < text.size() ? valid_sequence_length(text, start) : 0;
      start += step > 0 ? step : 1;
      continue;
    }
    matches.emplace_back(match_begin, match_end);
    start = last_end = match_end;
    have_last = true;
  }
  return matches;
}

std::string escape_regex(std::string_view literal) {
  std::string out;
  for (char c : literal) {
    if (std::string_view("\\.+*?()|[]{}^$#&-~").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

}  // namespace xmoe::tokenizer_detail
