// tokenizer.json "pre_tokenizer": Split (regex or literal, every HF behavior, invert), ByteLevel
// (add_prefix_space, use_regex with GPT-2's pattern), Digits and Sequence of them.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "llm/tokenizer/json_fields.hpp"

namespace xmoe::tokenizer_detail {

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Splits each piece further (and maps bytes, for ByteLevel); empty pieces are dropped, as in HF.
  virtual void pre_tokenize(std::vector<std::string>& pieces) const = 0;
};

// nullptr for a null pre-tokenizer. Errors name the field, e.g.
// "pre_tokenizer.pretokenizers[0].pattern.Regex".
std::unique_ptr<PreTokenizer> parse_pre_tokenizer(const Json& json, const JsonPath& at);

}  // namespace xmoe::tokenizer_detail
