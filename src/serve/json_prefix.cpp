#include "serve/json_prefix.hpp"

namespace xmoe::serve {

namespace {

bool is_ws(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}
bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
bool is_hex(char c) {
  return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

// Deep nesting is legal JSON but no tool argument needs it; the bound keeps completion() short.
constexpr size_t kMaxDepth = 64;

}  // namespace

size_t JsonPrefix::push(std::string_view text) {
  size_t n = 0;
  while (n < text.size() && push(text[n])) ++n;
  return n;
}

bool JsonPrefix::push(char c) {
  switch (lex_) {
    case Lex::string: {
      const auto u = static_cast<unsigned char>(c);
      if (escape_ == 1) {
        if (c == 'u') {
          escape_ = 5;
          return true;
        }
        if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' || c == 't') {
          escape_ = 0;
          return true;
        }
        return false;
      }
      if (escape_ >= 2) {
        if (!is_hex(c)) return false;
        escape_ = escape_ == 2 ? 0 : escape_ - 1;
        return true;
      }
      if (u < 0x20) return false;
      if (c == '\\') {
        escape_ = 1;
        return true;
      }
      if (c == '"') {
        lex_ = Lex::none;
        if (string_is_key_)
          expect_ = Expect::colon;
        else
          end_value();
        return true;
      }
      return true;
    }
    case Lex::literal:
      if (literal_[literal_pos_] != c) return false;
      if (literal_[++literal_pos_] == '\0') {
        lex_ = Lex::none;
        end_value();
      }
      return true;
    case Lex::number: {
      switch (num_) {
        case Num::minus:
          if (c == '0') return num_ = Num::zero, true;
          if (is_digit(c)) return num_ = Num::int_digits, true;
          return false;
        case Num::zero:
        case Num::int_digits:
          if (num_ == Num::int_digits && is_digit(c)) return true;
          if (c == '.') return num_ = Num::dot, true;
          if (c == 'e' || c == 'E') return num_ = Num::exp, true;
          break;
        case Num::dot:
          if (is_digit(c)) return num_ = Num::frac_digits, true;
          return false;
        case Num::frac_digits:
          if (is_digit(c)) return true;
          if (c == 'e' || c == 'E') return num_ = Num::exp, true;
          break;
        case Num::exp:
          if (c == '+' || c == '-') return num_ = Num::exp_sign, true;
          if (is_digit(c)) return num_ = Num::exp_digits, true;
          return false;
        case Num::exp_sign:
          if (is_digit(c)) return num_ = Num::exp_digits, true;
          return false;
        case Num::exp_digits:
          if (is_digit(c)) return true;
          break;
      }
      // c ends the number and is read as structure; undo when it does not fit there.
      const Expect saved = expect_;
      lex_ = Lex::none;
      end_value();
      if (push_structural(c)) return true;
      lex_ = Lex::number;
      expect_ = saved;
      return false;
    }
    case Lex::none:
      return push_structural(c);
  }
  return false;
}

bool JsonPrefix::push_structural(char c) {
  if (expect_ == Expect::done) return false;
  if (is_ws(c)) return true;
  switch (expect_) {
    case Expect::root:
      if (c != '{') return false;
      stack_.push_back('{');
      expect_ = Expect::key_or_close;
      return true;
    case Expect::value:
      return begin_value(c);
    case Expect::value_or_close:
      if (c == ']') {
        stack_.pop_back();
        end_value();
        return true;
      }
      return begin_value(c);
    case Expect::key_or_close:
      if (c == '}') {
        stack_.pop_back();
        end_value();
        return true;
      }
      [[fallthrough]];
    case Expect::key:
      if (c != '"') return false;
      lex_ = Lex::string;
      string_is_key_ = true;
      escape_ = 0;
      return true;
    case Expect::colon:
      if (c != ':') return false;
      expect_ = Expect::value;
      return true;
    case Expect::comma_or_close: {
      const char open = stack_.back();
      if (c == ',') {
        expect_ = open == '{' ? Expect::key : Expect::value;
        return true;
      }
      if ((open == '{' && c == '}') || (open == '[' && c == ']')) {
        stack_.pop_back();
        end_value();
        return true;
      }
      return false;
    }
    case Expect::done:
      return false;
  }
  return false;
}

bool JsonPrefix::begin_value(char c) {
  switch (c) {
    case '{':
    case '[':
      if (stack_.size() >= kMaxDepth) return false;
      stack_.push_back(c);
      expect_ = c == '{' ? Expect::key_or_close : Expect::value_or_close;
      return true;
    case '"':
      lex_ = Lex::string;
      string_is_key_ = false;
      escape_ = 0;
      return true;
    case 't':
    case 'f':
    case 'n':
      literal_ = c == 't' ? "true" : c == 'f' ? "false" : "null";
      literal_pos_ = 1;
      lex_ = Lex::literal;
      return true;
    case '-':
      lex_ = Lex::number;
      num_ = Num::minus;
      return true;
    default:
      if (!is_digit(c)) return false;
      lex_ = Lex::number;
      num_ = c == '0' ? Num::zero : Num::int_digits;
      return true;
  }
}

void JsonPrefix::end_value() {
  expect_ = stack_.empty() ? Expect::done : Expect::comma_or_close;
}

std::string JsonPrefix::completion() const {
  std::string out;
  switch (lex_) {
    case Lex::string:
      if (escape_ == 1) out += 'n';
      if (escape_ >= 2) out.append(escape_ - 1, '0');
      out += '"';
      if (string_is_key_) out += ":null";
      break;
    case Lex::literal:
      out += literal_ + literal_pos_;
      break;
    case Lex::number:
      if (num_ == Num::minus || num_ == Num::dot || num_ == Num::exp || num_ == Num::exp_sign) out += '0';
      break;
    case Lex::none:
      switch (expect_) {
        case Expect::root:
          out += '{';
          break;
        case Expect::value:
          out += "null";
          break;
        case Expect::key:
          out += "\"\":null";
          break;
        case Expect::colon:
          out += ":null";
          break;
        default:
          break;
      }
      break;
  }
  for (auto it = stack_.rbegin(); it != stack_.rend(); ++it) out += *it == '{' ? '}' : ']';
  if (expect_ == Expect::root) out += '}';
  return out;
}

size_t JsonPrefix::completion_size() const {
  return completion().size();
}

}  // namespace xmoe::serve
