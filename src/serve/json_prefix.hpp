// An incremental checker of "is this text a prefix of one JSON object?", byte by byte (RFC 8259 grammar;
// bytes >= 0x80 are taken as string content without UTF-8 validation). The output parsers use it to know
// where streamed tool arguments end; the forced-JSON logits processor uses it to allow only tokens that keep
// the text a valid prefix, and completion() to close the object when the token budget runs out.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace xmoe::serve {

class JsonPrefix {
 public:
  // Feeds one byte; false (and the state unchanged) when the byte cannot continue a JSON object, or when the
  // object is already complete.
  bool push(char c);
  // Feeds bytes until one is refused; returns how many were accepted.
  size_t push(std::string_view text);
  bool complete() const { return expect_ == Expect::done; }
  bool started() const { return expect_ != Expect::root; }
  bool in_string() const { return lex_ == Lex::string; }
  // Inside a string with no escape pending: any byte >= 0x20 other than '"' and '\' is accepted.
  bool in_plain_string() const { return lex_ == Lex::string && escape_ == 0; }
  // The shortest text that completes the object from here ("" once complete).
  std::string completion() const;
  size_t completion_size() const;

 private:
  enum class Expect : uint8_t {
    root,            // nothing yet: only '{' (or whitespace)
    value,           // after ':' or ','-in-array
    key_or_close,    // after '{'
    key,             // after ',' in an object
    colon,           // after a key
    comma_or_close,  // after a value
    value_or_close,  // after '['
    done,
  };
  enum class Lex : uint8_t { none, string, literal, number };
  enum class Num : uint8_t { minus, zero, int_digits, dot, frac_digits, exp, exp_sign, exp_digits };

  bool push_structural(char c);
  bool begin_value(char c);
  void end_value();
  bool number_can_end() const;

  std::string stack_;  // '{' or '[' per open container
  Expect expect_ = Expect::root;
  Lex lex_ = Lex::none;
  bool string_is_key_ = false;
  uint8_t escape_ = 0;  // 0 none, 1 after '\', 2..5: that many \u hex digits still to read (5 = 4 left)
  const char* literal_ = nullptr;  // "true", "false", "null" while lexing one
  uint8_t literal_pos_ = 0;
  Num num_ = Num::zero;
};

}  // namespace xmoe::serve
