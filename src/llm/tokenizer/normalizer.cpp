#include "llm/tokenizer/normalizer.hpp"

#include <vector>

#include "llm/tokenizer/pattern.hpp"
#include "llm/tokenizer/unicode.hpp"
#include "llm/tokenizer/utf8.hpp"

namespace xmoe::tokenizer_detail {
namespace {

class UnicodeNormalizer final : public Normalizer {
 public:
  explicit UnicodeNormalizer(NormalForm form) : form_(form) {}
  std::string normalize(std::string text) const override { return normalize_unicode(text, form_); }

 private:
  NormalForm form_;
};

class LowercaseNormalizer final : public Normalizer {
 public:
  std::string normalize(std::string text) const override { return lowercase_each_char(text); }
};

class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(Regex pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  std::string normalize(std::string text) const override {
    std::string out;
    size_t previous = 0;
    for (auto [begin, end] : pattern_.find_all(text)) {
      out.append(text, previous, begin - previous);
      out += content_;
      previous = end;
    }
    out.append(text, previous, std::string::npos);
    return out;
  }

 private:
  Regex pattern_;
  std::string content_;
};

class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  std::string normalize(std::string text) const override { return text.empty() ? text : prefix_ + text; }

 private:
  std::string prefix_;
};

class StripNormalizer final : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  std::string normalize(std::string text) const override {
    size_t begin = 0, end = text.size();
    if (left_) {
      while (begin < end) {
        size_t next = begin;
        if (!is_whitespace(next_code_point(text, next))) break;
        begin = next;
      }
    }
    if (right_) {
      while (end > begin) {
        size_t start = end - 1;
        while (start > begin && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
        size_t next = start;
        if (!is_whitespace(next_code_point(text, next))) break;
        end = start;
      }
    }
    return text.substr(begin, end - begin);
  }

 private:
  bool left_, right_;
};

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps) : steps_(std::move(steps)) {}
  std::string normalize(std::string text) const override {
    for (const auto& step : steps_) text = step->normalize(std::move(text));
    return text;
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

}  // namespace

std::unique_ptr<Normalizer> parse_normalizer(const Json& json, const JsonPath& at) {
  if (json.is_null()) return nullptr;
  const std::string type = require_string(json, "type", at);
  if (type == "NFC") return std::make_unique<UnicodeNormalizer>(NormalForm::kNFC);
  if (type == "NFD") return std::make_unique<UnicodeNormalizer>(NormalForm::kNFD);
  if (type == "NFKC") return std::make_unique<UnicodeNormalizer>(NormalForm::kNFKC);
  if (type == "NFKD") return std::make_unique<UnicodeNormalizer>(NormalForm::kNFKD);
  if (type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
  if (type == "Replace") {
    return std::make_unique<ReplaceNormalizer>(parse_pattern(require(json, "pattern", at), at / "pattern"),
                                               require_string(json, "content", at));
  }
  if (type == "Prepend") return std::make_unique<PrependNormalizer>(require_string(json, "prepend", at));
  if (type == "Strip") {
    return std::make_unique<StripNormalizer>(bool_or(json, "strip_left", true, at),
                                             bool_or(json, "strip_right", true, at));
  }
  if (type == "Sequence") {
    const Json& list = require_array(json, "normalizers", at);
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (size_t i = 0; i < list.size(); ++i) {
      auto step = parse_normalizer(list[i], (at / "normalizers")[i]);
      if (step) steps.push_back(std::move(step));
    }
    return std::make_unique<SequenceNormalizer>(std::move(steps));
  }
  XMOE_CHECK(false, (at / "type").str(), ": unsupported normalizer type '", type,
             "' (supported: NFC, NFD, NFKC, NFKD, Lowercase, Replace, Prepend, Strip, Sequence)");
  __builtin_unreachable();
}

}  // namespace xmoe::tokenizer_detail
