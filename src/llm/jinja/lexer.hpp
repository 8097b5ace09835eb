// Splits a template into text and tag tokens with jinja2's whitespace control as transformers configures it
// (trim_blocks, lstrip_blocks, keep_trailing_newline off), and tag contents into expression tokens.
#pragma once
#include <string>
#include <vector>

namespace xmoe::jinja {

enum class Tok { Data, BlockBegin, BlockEnd, VarBegin, VarEnd, Name, String, Integer, Float, Operator, Eof };

struct Token {
  Tok type;
  std::string text;  // Data: the text; String: the unescaped value; others: the source spelling
  int line = 1;
  int column = 1;
};

// Throws xmoe::Error naming `name`, the line and column on text jinja2's lexer rejects.
std::vector<Token> tokenize(const std::string& source, const std::string& name);

}  // namespace xmoe::jinja
