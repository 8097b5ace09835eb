// Oniguruma regexes (Ruby syntax, UTF-8), the engine HF tokenizers uses for its patterns.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace xmoe::tokenizer_detail {

class Regex {
 public:
  // Throws xmoe::Error "<where>: invalid regex ...: <Oniguruma's message>".
  Regex(const std::string& pattern, const std::string& where);
  // Non-overlapping matches left to right as [begin, end) byte offsets; an empty match right where the
  // previous one ended is skipped, as Rust's find_iter does. Thread-safe.
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view text) const;

 private:
  std::shared_ptr<void> regex_;  // OnigRegex
};

// The pattern that matches `literal` exactly (HF escapes a Split/Replace "String" pattern this way).
std::string escape_regex(std::string_view literal);

}  // namespace xmoe::tokenizer_detail
