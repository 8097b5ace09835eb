// Finds stop strings in text that arrives in pieces (one decoded token at a time). Text that could still be
// the start of a stop string is held back, so what has been emitted never has to be taken back, and the stop
// string itself is never emitted.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace xmoe::llm {

class StopStringMatcher {
 public:
  // Throws xmoe::Error when a stop string is empty.
  explicit StopStringMatcher(std::vector<std::string> stop_strings);

  struct Result {
    std::string text;      // safe to emit now
    bool stopped = false;  // a stop string ended the text; nothing more is accepted
    std::string stop_string;
  };
  // Appends a piece. On a match, `text` ends right before the earliest stop string (the first listed one when
  // several start at the same place).
  Result push(std::string_view piece);
  // The held-back text, at the end of generation (empty after a stop).
  std::string flush();
  bool stopped() const { return stopped_; }

 private:
  size_t holdback_length() const;  // longest suffix of pending_ that is a proper prefix of a stop string
  std::vector<std::string> stops_;
  std::string pending_;
  bool stopped_ = false;
};

}  // namespace xmoe::llm
