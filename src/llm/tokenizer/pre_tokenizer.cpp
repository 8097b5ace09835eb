#include "llm/tokenizer/pre_tokenizer.hpp"

#include <algorithm>
#include <utility>

#include "llm/tokenizer/byte_level.hpp"
#include "llm/tokenizer/pattern.hpp"

namespace xmoe::tokenizer_detail {
namespace {

// HF's SplitDelimiterBehavior.
enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

Behavior parse_behavior(const std::string& name, const JsonPath& at) {
  if (name == "Removed") return Behavior::kRemoved;
  if (name == "Isolated") return Behavior::kIsolated;
  if (name == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return Behavior::kMergedWithNext;
  if (name == "Contiguous") return Behavior::kContiguous;
  XMOE_CHECK(false, at.str(), ": unknown split behavior '", name,
             "' (expected Removed, Isolated, MergedWithPrevious, MergedWithNext or Contiguous)");
  __builtin_unreachable();
}

struct Span {
  size_t begin, end;
  bool is_match;
};

// NormalizedString::split of HF tokenizers: the regex's matches and the gaps between them cover the text;
// the behavior decides which spans are kept and how matches join their neighbours.
void split_text(const std::string& text, const Regex& regex, Behavior behavior, bool invert,
                std::vector<std::string>& out) {
  std::vector<Span> spans;
  size_t previous = 0;
  for (auto [begin, end] : regex.find_all(text)) {
    if (begin != previous) spans.push_back({previous, begin, invert});
    spans.push_back({begin, end, !invert});
    previous = end;
  }
  if (previous != text.size()) spans.push_back({previous, text.size(), invert});

  std::vector<std::pair<size_t, size_t>> kept;
  switch (behavior) {
    case Behavior::kRemoved:
      for (const Span& s : spans)
        if (!s.is_match) kept.emplace_back(s.begin, s.end);
      break;
    case Behavior::kIsolated:
      for (const Span& s : spans) kept.emplace_back(s.begin, s.end);
      break;
    case Behavior::kContiguous: {
      bool previous_match = false;
      for (const Span& s : spans) {
        if (s.is_match == previous_match && !kept.empty()) {
          kept.back().second = s.end;
        } else {
          kept.emplace_back(s.begin, s.end);
        }
        previous_match = s.is_match;
      }
      break;
    }
    case Behavior::kMergedWithPrevious: {
      bool previous_match = false;
      for (const Span& s : spans) {
        if (s.is_match && !previous_match && !kept.empty()) {
          kept.back().second = s.end;
        } else {
          kept.emplace_back(s.begin, s.end);
        }
        previous_match = s.is_match;
      }
      break;
    }
    case Behavior::kMergedWithNext: {
      bool previous_match = false;
      for (size_t i = spans.size(); i-- > 0;) {
        const Span& s = spans[i];
        if (s.is_match && !previous_match && !kept.empty()) {
          kept.back().first = s.begin;
        } else {
          kept.emplace_back(s.begin, s.end);
        }
        previous_match = s.is_match;
      }
      std::reverse(kept.begin(), kept.end());
      break;
    }
  }
  for (auto [begin, end] : kept)
    if (end > begin) out.push_back(text.substr(begin, end - begin));
}

class SplitPreTokenizer final : public PreTokenizer {
 public:
  SplitPreTokenizer(Regex regex, Behavior behavior, bool invert)
      : regex_(std::move(regex)), behavior_(behavior), invert_(invert) {}
  void pre_tokenize(std::vector<std::string>& pieces) const override {
    std::vector<std::string> out;
    for (const std::string& piece : pieces) split_text(piece, regex_, behavior_, invert_, out);
    pieces = std::move(out);
  }

 private:
  Regex regex_;
  Behavior behavior_;
  bool invert_;
};

// GPT-2's pattern, which HF's ByteLevel pre-tokenizer applies when use_regex is true.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex, const JsonPath& at)
      : add_prefix_space_(add_prefix_space),
        regex_(use_regex ? std::make_unique<Regex>(kGpt2Pattern, at.str()) : nullptr) {}
  void pre_tokenize(std::vector<std::string>& pieces) const override {
    const ByteLevelTable& table = byte_level_table();
    std::vector<std::string> split;
    for (std::string& piece : pieces) {
      if (add_prefix_space_ && piece.front() != ' ') piece.insert(piece.begin(), ' ');
      if (regex_) {
        split_text(piece, *regex_, Behavior::kIsolated, false, split);
      } else {
        split.push_back(std::move(piece));
      }
    }
    for (std::string& piece : split) piece = table.encode(piece);
    pieces = std::move(split);
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> regex_;
};

class SequencePreTokenizer final : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> steps)
      : steps_(std::move(steps)) {}
  void pre_tokenize(std::vector<std::string>& pieces) const override {
    for (const auto& step : steps_) step->pre_tokenize(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

}  // namespace

std::unique_ptr<PreTokenizer> parse_pre_tokenizer(const Json& json, const JsonPath& at) {
  if (json.is_null()) return nullptr;
  const std::string type = require_string(json, "type", at);
  if (type == "Split") {
    return std::make_unique<SplitPreTokenizer>(
        parse_pattern(require(json, "pattern", at), at / "pattern"),
        parse_behavior(require_string(json, "behavior", at), at / "behavior"),
        bool_or(json, "invert", false, at));
  }
  if (type == "ByteLevel") {
    return std::make_unique<ByteLevelPreTokenizer>(bool_or(json, "add_prefix_space", true, at),
                                                   bool_or(json, "use_regex", true, at), at);
  }
  if (type == "Digits") {
    // Rust's char::is_numeric is the general categories Nd, Nl and No: \p{N}.
    const bool individual = bool_or(json, "individual_digits", false, at);
    return std::make_unique<SplitPreTokenizer>(Regex(individual ? "\\p{N}" : "\\p{N}+", at.str()),
                                               individual ? Behavior::kIsolated : Behavior::kContiguous,
                                               false);
  }
  if (type == "Sequence") {
    const Json& list = require_array(json, "pretokenizers", at);
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    for (size_t i = 0; i < list.size(); ++i) {
      auto step = parse_pre_tokenizer(list[i], (at / "pretokenizers")[i]);
      if (step) steps.push_back(std::move(step));
    }
    return std::make_unique<SequencePreTokenizer>(std::move(steps));
  }
  XMOE_CHECK(false, (at / "type").str(), ": unsupported pre-tokenizer type '", type,
             "' (supported: Split, ByteLevel, Digits, Sequence)");
  __builtin_unreachable();
}

}  // namespace xmoe::tokenizer_detail
