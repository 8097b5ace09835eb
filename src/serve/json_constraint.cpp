#include "serve/json_constraint.hpp"

#include <algorithm>
#include <limits>

#include "serve/json_prefix.hpp"

namespace xmoe::serve {

namespace {

bool plain_string_byte(unsigned char c) {
  return c >= 0x20 && c != '"' && c != '\\';
}

// Where a sequence is in OPENING OBJECT SUFFIX END.
struct ConstraintState {
  enum class Phase { opening, object, suffix, end } phase = Phase::opening;
  std::string opening;  // the opening's text so far
  JsonPrefix json;
  size_t suffix_pos = 0;
};

class JsonProcessor {
 public:
  JsonProcessor(std::shared_ptr<const TokenTexts> texts, JsonConstraint c)
      : texts_(std::move(texts)), c_(std::move(c)) {
    auto banned = std::make_shared<std::vector<uint8_t>>(texts_->text.size(), 0);
    for (size_t t = 0; t < texts_->text.size(); ++t)
      for (const std::string& f : c_.forbidden)
        if (texts_->text[t].find(f) != std::string::npos) (*banned)[t] = 1;
    banned_ = std::move(banned);
  }

  void operator()(std::span<float> logits, std::span<const int32_t> generated) const {
    ConstraintState s = initial();
    for (const int32_t t : generated) {
      // A token the constraint did not allow (possible only if the engine ignored the mask): stop steering.
      if (t < 0 || static_cast<size_t>(t) >= texts_->text.size() || !feed(s, texts_->text[t])) return;
    }
    const int64_t after_this = c_.max_tokens - static_cast<int64_t>(generated.size()) - 1;
    std::vector<uint8_t> allowed(logits.size(), 0);
    bool any = false;
    auto allow = [&](int32_t t) {
      if (t >= 0 && static_cast<size_t>(t) < allowed.size()) allowed[t] = 1, any = true;
    };
    // When no token leaves enough budget to close (a budget too small for the markup), the tokens that
    // bring the end nearest are allowed, so that the text is as complete as it can be when it is cut.
    size_t best_need = std::numeric_limits<size_t>::max();
    std::vector<int32_t> nearest;
    auto consider = [&](int32_t t, size_t need) {
      if (static_cast<int64_t>(need) <= after_this) return allow(t);
      if (need < best_need) best_need = need, nearest.clear();
      if (need == best_need) nearest.push_back(t);
    };
    if (s.phase == ConstraintState::Phase::end) {
      for (int32_t t : c_.end_tokens) allow(t);
    } else {
      const bool plain_string = s.phase == ConstraintState::Phase::object && s.json.in_plain_string();
      const size_t need_now = needed(s);
      for (int b = 0; b < 256; ++b) {
        const auto& bucket = texts_->by_first_byte[b];
        if (bucket.empty()) continue;
        ConstraintState probe = s;
        if (!feed_byte(probe, static_cast<char>(b))) continue;
        for (const int32_t t : bucket) {
          if ((*banned_)[t]) continue;
          if (plain_string && texts_->plain_string[t]) {
            consider(t, need_now);
            continue;
          }
          ConstraintState next = s;
          if (feed(next, texts_->text[t])) consider(t, needed(next));
        }
      }
      if (!any)
        for (int32_t t : nearest) allow(t);
    }
    if (!any) return;  // nothing fits (a vocabulary without single-byte tokens): leave the row alone
    for (size_t i = 0; i < logits.size(); ++i)
      if (!allowed[i]) logits[i] = -std::numeric_limits<float>::infinity();
  }

 private:
  ConstraintState initial() const {
    ConstraintState s;
    if (c_.openings.empty()) s.phase = ConstraintState::Phase::object;
    return s;
  }

  bool feed(ConstraintState& s, const std::string& text) const {
    for (const char ch : text)
      if (!feed_byte(s, ch)) return false;
    return true;
  }

  bool feed_byte(ConstraintState& s, char ch) const {
    switch (s.phase) {
      case ConstraintState::Phase::opening: {
        s.opening += ch;
        bool prefix = false;
        for (const std::string& o : c_.openings) {
          if (o == s.opening) {
            s.phase = ConstraintState::Phase::object;
            return true;
          }
          prefix = prefix || o.starts_with(s.opening);
        }
        return prefix;
      }
      case ConstraintState::Phase::object:
        // Whitespace before the object would only spend budget.
        if (!s.json.started() && ch != '{') return false;
        if (!s.json.push(ch)) return false;
        if (s.json.complete())
          s.phase = c_.suffix.empty() ? ConstraintState::Phase::end : ConstraintState::Phase::suffix;
        return true;
      case ConstraintState::Phase::suffix:
        if (c_.suffix[s.suffix_pos] != ch) return false;
        if (++s.suffix_pos == c_.suffix.size()) s.phase = ConstraintState::Phase::end;
        return true;
      case ConstraintState::Phase::end:
        return false;
    }
    return false;
  }

  // Bytes still to write before the end token, at the least.
  size_t needed(const ConstraintState& s) const {
    switch (s.phase) {
      case ConstraintState::Phase::opening: {
        size_t best = std::numeric_limits<size_t>::max();
        for (const std::string& o : c_.openings)
          if (o.starts_with(s.opening)) best = std::min(best, o.size() - s.opening.size());
        return best + 2 + c_.suffix.size();  // "{}"
      }
      case ConstraintState::Phase::object:
        return s.json.completion_size() + c_.suffix.size();
      case ConstraintState::Phase::suffix:
        return c_.suffix.size() - s.suffix_pos;
      case ConstraintState::Phase::end:
        return 0;
    }
    return 0;
  }

  std::shared_ptr<const TokenTexts> texts_;
  JsonConstraint c_;
  std::shared_ptr<const std::vector<uint8_t>> banned_;  // shared: std::function copies the processor
};

}  // namespace

std::shared_ptr<const TokenTexts> make_token_texts(const Tokenizer& tokenizer) {
  auto t = std::make_shared<TokenTexts>();
  const auto n = static_cast<size_t>(tokenizer.vocab_size());
  t->text.resize(n);
  t->special.assign(n, 0);
  t->plain_string.assign(n, 0);
  for (size_t i = 0; i < n; ++i) {
    const auto id = static_cast<int32_t>(i);
    const int32_t ids[1] = {id};
    t->text[i] = tokenizer.decode(ids);
    t->special[i] = tokenizer.is_special(id) ? 1 : 0;
    const std::string& s = t->text[i];
    t->plain_string[i] = std::all_of(s.begin(), s.end(),
                                     [](char c) { return plain_string_byte(static_cast<unsigned char>(c)); });
    if (!t->special[i] && !s.empty()) t->by_first_byte[static_cast<unsigned char>(s[0])].push_back(id);
  }
  return t;
}

LogitsProcessor make_json_logits_processor(std::shared_ptr<const TokenTexts> texts,
                                           JsonConstraint constraint) {
  return JsonProcessor(std::move(texts), std::move(constraint));
}

LogitsProcessor make_thinking_budget_processor(int32_t close_token, int64_t budget) {
  return [close_token, budget](std::span<float> logits, std::span<const int32_t> generated) {
    if (static_cast<int64_t>(generated.size()) < budget) return;
    if (std::find(generated.begin(), generated.end(), close_token) != generated.end()) return;
    if (close_token < 0 || static_cast<size_t>(close_token) >= logits.size()) return;
    for (size_t i = 0; i < logits.size(); ++i)
      if (static_cast<int32_t>(i) != close_token) logits[i] = -std::numeric_limits<float>::infinity();
  };
}

LogitsProcessor chain_processors(LogitsProcessor first, LogitsProcessor second) {
  if (!first) return second;
  if (!second) return first;
  return [first = std::move(first), second = std::move(second)](std::span<float> logits,
                                                                std::span<const int32_t> generated) {
    first(logits, generated);
    second(logits, generated);
  };
}

}  // namespace xmoe::serve
