// tokenizer.json "normalizer": NFC/NFD/NFKC/NFKD, Lowercase, Replace, Prepend, Strip and Sequence of them.
#pragma once
#include <memory>
#include <string>

#include "llm/tokenizer/json_fields.hpp"

namespace xmoe::tokenizer_detail {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual std::string normalize(std::string text) const = 0;
};

// nullptr for a null normalizer. Errors name the field, e.g. "normalizer.normalizers[1].type".
std::unique_ptr<Normalizer> parse_normalizer(const Json& json, const JsonPath& at);

}  // namespace xmoe::tokenizer_detail
