// A tokenizer.json pattern: {"String": literal} or {"Regex": pattern}, both run as an Oniguruma regex.
#pragma once
#include "llm/tokenizer/json_fields.hpp"
#include "llm/tokenizer/regex.hpp"

namespace xmoe::tokenizer_detail {

inline Regex parse_pattern(const Json& pattern, const JsonPath& at) {
  XMOE_CHECK(pattern.is_object() && pattern.size() == 1, at.str(),
             ": expected {\"String\": ...} or {\"Regex\": ...}");
  if (const Json* literal = optional_field(pattern, "String")) {
    XMOE_CHECK(literal->is_string(), (at / "String").str(), ": expected a string");
    return Regex(escape_regex(literal->get<std::string>()), (at / "String").str());
  }
  if (const Json* regex = optional_field(pattern, "Regex")) {
    XMOE_CHECK(regex->is_string(), (at / "Regex").str(), ": expected a string");
    return Regex(regex->get<std::string>(), (at / "Regex").str());
  }
  XMOE_CHECK(false, at.str(), ": expected {\"String\": ...} or {\"Regex\": ...}");
  __builtin_unreachable();
}

}  // namespace xmoe::tokenizer_detail
