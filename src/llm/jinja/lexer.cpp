#include "lexer.hpp"

#include <cstring>

#include "pystr.hpp"
#include "xmoe/error.hpp"

namespace xmoe::jinja {
namespace {

bool is_ascii_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
bool is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool is_name_char(char c) {
  return is_name_start(c) || is_digit(c);
}

// jinja2 runs \r\n and \r through the newline sequence and drops one trailing newline.
std::string normalize(const std::string& source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out.push_back(source[i]);
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

class Lexer {
 public:
  Lexer(const std::string& source, const std::string& name) : src_(normalize(source)), name_(name) {}

  std::vector<Token> run() {
    if (const auto bad = pystr::find_invalid_utf8(src_)) error(*bad, "the template is not valid UTF-8");
    while (pos_ < src_.size()) lex_root();
    tokens_.push_back({Tok::Eof, "", line_, column(pos_)});
    return std::move(tokens_);
  }

 private:
  [[noreturn]] void error(size_t at, const std::string& what) const {
    throw Error(detail::concat("chat template '", name_, "', line ", line_at(at), ", column ", column(at),
                               ": ", what));
  }
  int line_at(size_t at) const {
    int line = 1;
    for (size_t i = 0; i < at && i < src_.size(); ++i) line += src_[i] == '\n';
    return line;
  }
  int column(size_t at) const {
    // Tokens ask at pos_, on the current line: a search back for its start per token would be quadratic on a
    // long line (a 12 KB one-line template took over 1 s under ASan; found by fuzzing).
    if (at >= line_start_ && at <= pos_) return static_cast<int>(at - line_start_ + 1);
    const size_t nl = at == 0 ? std::string::npos : src_.rfind('\n', at - 1);
    return static_cast<int>(nl == std::string::npos ? at + 1 : at - nl);
  }
  void advance_to(size_t to) {
    for (size_t i = pos_; i < to; ++i) {
      if (src_[i] == '\n') {
        ++line_;
        line_start_ = i + 1;
      }
    }
    pos_ = to;
  }
  bool starts(size_t at, const char* s) const { return src_.compare(at, std::strlen(s), s) == 0; }
  size_t skip_space(size_t at) const {
    while (at < src_.size() && is_ascii_space(src_[at])) ++at;
    return at;
  }

  // The text before a tag, with `{%-` / lstrip_blocks applied as jinja2's OptionalLStrip does.
  std::string strip_before(std::string text, char sign, bool is_variable) const {
    if (sign == '-') return pystr::strip(text, std::nullopt, false, true);
    if (sign != '+' && !is_variable) {
      const size_t nl = text.rfind('\n');
      const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
      if (l_pos > 0 || line_starting_) {
        bool all_space = true;
        for (size_t i = l_pos; i < text.size(); ++i) all_space = all_space && is_ascii_space(text[i]);
        if (all_space) text.resize(l_pos);
      }
    }
    return text;
  }

  void emit_data(std::string text, int line) {
    if (!text.empty()) tokens_.push_back({Tok::Data, std::move(text), line, 1});
  }

  // Matches a block end (`%}`, `-%}` + whitespace, `+%}`, `%}` + one newline under trim_blocks) at `at`.
  size_t match_block_end(size_t at, const char* end) const {
    if (src_[at] == '+' && starts(at + 1, end)) return at + 3;
    if (src_[at] == '-' && starts(at + 1, end)) return skip_space(at + 3);
    if (starts(at, end)) return at + 2 + (at + 2 < src_.size() && src_[at + 2] == '\n' ? 1 : 0);
    return std::string::npos;
  }

  void lex_root() {
    size_t p = pos_;
    while (true) {
      p = src_.find('{', p);
      if (p == std::string::npos || p + 1 >= src_.size()) {
        emit_data(src_.substr(pos_), line_);
        advance_to(src_.size());
        return;
      }
      const char kind = src_[p + 1];
      if (kind == '%' || kind == '{' || kind == '#') break;
      ++p;
    }
    const char kind = src_[p + 1];
    const char sign = p + 2 < src_.size() && (src_[p + 2] == '-' || src_[p + 2] == '+') ? src_[p + 2] : 0;
    const size_t after = p + 2 + (sign ? 1 : 0);
    const int text_line = line_;
    emit_data(strip_before(src_.substr(pos_, p - pos_), sign, kind == '{'), text_line);
    advance_to(p);
    if (kind == '%' && lex_raw(after)) return;
    if (kind == '#') {
      lex_comment(after);
      return;
    }
    tokens_.push_back(
        {kind == '%' ? Tok::BlockBegin : Tok::VarBegin, src_.substr(p, after - p), line_, column(p)});
    advance_to(after);
    line_starting_ = false;
    lex_tag(kind == '%');
  }

  void lex_comment(size_t from) {
    for (size_t q = from; q + 1 < src_.size(); ++q) {
      size_t end = std::string::npos;
      if (src_[q] == '+' && starts(q + 1, "#}"))
        end = q + 3;
      else if (src_[q] == '-' && starts(q + 1, "#}"))
        end = skip_space(q + 3);
      else if (starts(q, "#}"))
        end = q + 2 + (q + 2 < src_.size() && src_[q + 2] == '\n' ? 1 : 0);
      if (end != std::string::npos) {
        advance_to(end);
        line_starting_ = src_[end - 1] == '\n';
        return;
      }
    }
    error(pos_, "Missing end of comment tag");
  }

  // `{% raw %}...{% endraw %}`: the body is text, untouched except for whitespace control at its edges.
  bool lex_raw(size_t after_sign) {
    size_t q = skip_space(after_sign);
    if (!starts(q, "raw")) return false;
    q = skip_space(q + 3);
    size_t body;
    if (starts(q, "-%}"))
      body = skip_space(q + 3);
    else if (starts(q, "%}"))
      body = q + 2;
    else
      return false;
    line_starting_ = src_[body - 1] == '\n';
    for (size_t e = src_.find("{%", body); e != std::string::npos; e = src_.find("{%", e + 1)) {
      const char sign = e + 2 < src_.size() && (src_[e + 2] == '-' || src_[e + 2] == '+') ? src_[e + 2] : 0;
      size_t r = skip_space(e + 2 + (sign ? 1 : 0));
      if (!starts(r, "endraw")) continue;
      r = skip_space(r + 6);
      const size_t end = r < src_.size() ? match_block_end(r, "%}") : std::string::npos;
      if (end == std::string::npos) continue;
      advance_to(body);
      emit_data(strip_before(src_.substr(body, e - body), sign, false), line_);
      advance_to(end);
      line_starting_ = src_[end - 1] == '\n';
      return true;
    }
    error(pos_, "Missing end of raw directive");
  }

  void lex_tag(bool block) {
    std::vector<char> balance;
    const char* end_text = block ? "%}" : "}}";
    while (true) {
      if (pos_ >= src_.size())
        error(pos_, std::string("unexpected end of template, expected '") + end_text + "'");
      if (balance.empty()) {
        size_t end = std::string::npos;
        if (block) {
          end = match_block_end(pos_, "%}");
        } else if (src_[pos_] == '-' && starts(pos_ + 1, "}}")) {
          end = skip_space(pos_ + 3);
        } else if (starts(pos_, "}}")) {
          end = pos_ + 2;
        }
        if (end != std::string::npos) {
          tokens_.push_back(
              {block ? Tok::BlockEnd : Tok::VarEnd, src_.substr(pos_, end - pos_), line_, column(pos_)});
          advance_to(end);
          line_starting_ = src_[end - 1] == '\n';
          return;
        }
      }
      const char c = src_[pos_];
      const size_t start = pos_;
      const int line = line_, col = column(pos_);
      if (is_ascii_space(c)) {
        const size_t to = skip_space(pos_);
        line_starting_ = src_[to - 1] == '\n';
        advance_to(to);
        continue;
      }
      line_starting_ = false;
      if (is_digit(c)) {
        lex_number(start, line, col);
      } else if (is_name_start(c)) {
        size_t e = pos_;
        while (e < src_.size() && is_name_char(src_[e])) ++e;
        tokens_.push_back({Tok::Name, src_.substr(pos_, e - pos_), line, col});
        advance_to(e);
      } else if (c == '\'' || c == '"') {
        lex_string(start, line, col);
      } else {
        static const char* const ops[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/",
                                          "*",  "%",  "~",  "[",  "]",  "(",  ")", "{", "}",
                                          ">",  "<",  "=",  ".",  ":",  "|",  ",", ";"};
        const char* op = nullptr;
        for (const char* candidate : ops)
          if (starts(pos_, candidate)) {
            op = candidate;
            break;
          }
        if (!op) error(pos_, std::string("unexpected char '") + c + "'");
        const std::string text = op;
        if (text == "(" || text == "[" || text == "{") {
          balance.push_back(text == "(" ? ')' : text == "[" ? ']' : '}');
        } else if (text == ")" || text == "]" || text == "}") {
          if (balance.empty()) error(pos_, "unexpected '" + text + "'");
          if (balance.back() != text[0])
            error(pos_, "unexpected '" + text + "', expected '" + std::string(1, balance.back()) + "'");
          balance.pop_back();
        }
        tokens_.push_back({Tok::Operator, text, line, col});
        advance_to(pos_ + text.size());
      }
    }
  }

  void lex_number(size_t start, int line, int col) {
    auto digits = [&](size_t at) {  // \d+(_\d+)*
      if (at >= src_.size() || !is_digit(src_[at])) return std::string::npos;
      while (at < src_.size() &&
             (is_digit(src_[at]) || (src_[at] == '_' && at + 1 < src_.size() && is_digit(src_[at + 1]))))
        ++at;
      return at;
    };
    const size_t int_end = digits(start);
    size_t end = int_end;
    bool is_float = false;
    const bool after_dot = start > 0 && src_[start - 1] == '.';
    if (!after_dot) {
      size_t e = int_end;
      if (e < src_.size() && src_[e] == '.' && digits(e + 1) != std::string::npos) {
        e = digits(e + 1);
        is_float = true;
      }
      if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
        size_t x = e + 1;
        if (x < src_.size() && (src_[x] == '+' || src_[x] == '-')) ++x;
        if (digits(x) != std::string::npos) {
          e = digits(x);
          is_float = true;
        }
      }
      if (is_float) end = e;
    }
    std::string text;
    for (size_t i = start; i < end; ++i)
      if (src_[i] != '_') text.push_back(src_[i]);
    tokens_.push_back({is_float ? Tok::Float : Tok::Integer, text, line, col});
    advance_to(end);
  }

  void lex_string(size_t start, int line, int col) {
    const char quote = src_[start];
    size_t e = start + 1;
    while (e < src_.size() && src_[e] != quote) e += src_[e] == '\\' ? 2 : 1;
    if (e >= src_.size()) error(start, "unexpected char '" + std::string(1, quote) + "'");
    tokens_.push_back({Tok::String, unescape(src_.substr(start + 1, e - start - 1), start), line, col});
    advance_to(e + 1);
  }

  // Python's "unicode-escape" decoding, which jinja2 applies to string literals.
  std::string unescape(const std::string& raw, size_t at) const {
    std::string out;
    for (size_t i = 0; i < raw.size(); ++i) {
      if (raw[i] != '\\' || i + 1 >= raw.size()) {
        out.push_back(raw[i]);
        continue;
      }
      const char c = raw[++i];
      auto read_hex = [&](int count) {
        char32_t cp = 0;
        for (int k = 0; k < count; ++k) {
          const int h = i + 1 < raw.size() ? hex_value(raw[i + 1]) : -1;
          if (h < 0) error(at, "invalid \\x, \\u or \\U escape in string literal");
          cp = cp * 16 + static_cast<char32_t>(h);
          ++i;
        }
        pystr::append_utf8(out, cp);
      };
      switch (c) {
        case '\n':
          break;
        case '\\':
        case '\'':
        case '"':
          out.push_back(c);
          break;
        case 'n':
          out.push_back('\n');
          break;
        case 't':
          out.push_back('\t');
          break;
        case 'r':
          out.push_back('\r');
          break;
        case 'a':
          out.push_back('\a');
          break;
        case 'b':
          out.push_back('\b');
          break;
        case 'f':
          out.push_back('\f');
          break;
        case 'v':
          out.push_back('\v');
          break;
        case 'x':
          read_hex(2);
          break;
        case 'u':
          read_hex(4);
          break;
        case 'U':
          read_hex(8);
          break;
        case 'N':
          error(at, "\\N{...} escapes in string literals are not supported");
        default:
          if (c >= '0' && c <= '7') {
            char32_t cp = static_cast<char32_t>(c - '0');
            for (int k = 0; k < 2 && i + 1 < raw.size() && raw[i + 1] >= '0' && raw[i + 1] <= '7'; ++k)
              cp = cp * 8 + static_cast<char32_t>(raw[++i] - '0');
            pystr::append_utf8(out, cp);
          } else {
            out.push_back('\\');
            out.push_back(c);
          }
      }
    }
    return out;
  }

  std::string src_;
  const std::string& name_;
  size_t pos_ = 0;
  int line_ = 1;
  size_t line_start_ = 0;  // where line_ begins in src_
  bool line_starting_ = true;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> tokenize(const std::string& source, const std::string& name) {
  return Lexer(source, name).run();
}

}  // namespace xmoe::jinja
