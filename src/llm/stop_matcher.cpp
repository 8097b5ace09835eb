#include "llm/stop_matcher.hpp"

#include <algorithm>

#include "xmoe/error.hpp"

namespace xmoe::llm {

StopStringMatcher::StopStringMatcher(std::vector<std::string> stop_strings)
    : stops_(std::move(stop_strings)) {
  for (size_t i = 0; i < stops_.size(); ++i)
    XMOE_CHECK(!stops_[i].empty(), "stop strings: entry ", i, " is empty");
}

StopStringMatcher::Result StopStringMatcher::push(std::string_view piece) {
  Result r;
  if (stopped_) {
    r.stopped = true;
    return r;
  }
  // A match can only involve the held-back text plus the new piece, so searching pending_ finds it.
  pending_.append(piece);
  size_t best = std::string::npos;
  const std::string* match = nullptr;
  for (const std::string& s : stops_) {
    const size_t at = pending_.find(s);
    if (at < best) {
      best = at;
      match = &s;
    }
  }
  if (match) {
    r.text = pending_.substr(0, best);
    r.stopped = stopped_ = true;
    r.stop_string = *match;
    pending_.clear();
    return r;
  }
  const size_t keep = holdback_length();
  r.text = pending_.substr(0, pending_.size() - keep);
  pending_.erase(0, pending_.size() - keep);
  return r;
}

std::string StopStringMatcher::flush() {
  std::string out;
  out.swap(pending_);
  return out;
}

size_t StopStringMatcher::holdback_length() const {
  size_t longest_stop = 0;
  for (const std::string& s : stops_) longest_stop = std::max(longest_stop, s.size());
  for (size_t len = std::min(pending_.size(), longest_stop == 0 ? 0 : longest_stop - 1); len > 0; --len) {
    const std::string_view suffix = std::string_view(pending_).substr(pending_.size() - len);
    for (const std::string& s : stops_)
      if (std::string_view(s).starts_with(suffix)) return len;
  }
  return 0;
}

}  // namespace xmoe::llm
