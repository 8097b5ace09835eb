// Forced JSON: a logits processor that lets a sequence write only text of the form
//   ALTERNATIVE? OBJECT SUFFIX END
// (one of a set of literal openings, one JSON object, a literal closing, then an end token), so that even a
// random model produces a parseable tool call (tool_choice required/named) or JSON answer (response_format
// json_object). Each step allows exactly the tokens that keep the text a valid prefix and leave enough budget
// to close: when max_tokens is near, only tokens that spell the shortest completion remain.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "xmoe/tokenizer.hpp"

namespace xmoe::serve {

using LogitsProcessor = std::function<void(std::span<float> logits, std::span<const int32_t> generated)>;

// Every token's decoded bytes, computed once per tokenizer (the runtime keeps it in ModelInfo).
struct TokenTexts {
  std::vector<std::string> text;
  std::vector<uint8_t> special;       // 1: a special token (never part of constrained text)
  std::vector<uint8_t> plain_string;  // 1: bytes that may sit anywhere inside a JSON string unchanged
  std::array<std::vector<int32_t>, 256> by_first_byte;  // non-special, non-empty tokens by first byte
};
std::shared_ptr<const TokenTexts> make_token_texts(const Tokenizer& tokenizer);

struct JsonConstraint {
  std::vector<std::string> openings;  // the text starts with one of these (none: starts with the object)
  std::string suffix;                 // written after the object
  std::vector<int32_t> end_tokens;    // the only tokens allowed once the suffix is written (eos)
  int64_t max_tokens = 0;             // the request's budget, including the end token
  // Tokens whose text holds one of these are never allowed (the family's markup: a "</tool_call>" inside
  // an argument string would end the call early for the output parser).
  std::vector<std::string> forbidden;
};
LogitsProcessor make_json_logits_processor(std::shared_ptr<const TokenTexts> texts,
                                           JsonConstraint constraint);

// Ends thinking after `budget` generated tokens by forcing `close_token` (Qwen3's </think>) unless the
// model has closed it already.
LogitsProcessor make_thinking_budget_processor(int32_t close_token, int64_t budget);

// Runs `first` then `second` on the same row.
LogitsProcessor chain_processors(LogitsProcessor first, LogitsProcessor second);

}  // namespace xmoe::serve
