#include "parser.hpp"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>

#include "lexer.hpp"
#include "xmoe/error.hpp"

namespace xmoe::jinja {
namespace {

const char* const kUnsupportedTags[] = {"include", "extends",   "block",  "import",     "from",
                                        "call",    "filter",    "with",   "autoescape", "do",
                                        "trans",   "pluralize", "endcall"};

class Parser {
 public:
  Parser(std::vector<Token> tokens, const std::string& name) : toks_(std::move(tokens)), name_(name) {}

  Body parse_all() {
    Body body = parse_body({});
    return body;
  }

 private:
  const Token& cur() const { return toks_[pos_]; }
  const Token& peek(size_t n = 1) const { return toks_[std::min(pos_ + n, toks_.size() - 1)]; }
  Token next() { return toks_[pos_ < toks_.size() - 1 ? pos_++ : pos_]; }

  [[noreturn]] void error(const Token& at, const std::string& what) const {
    throw Error(
        detail::concat("chat template '", name_, "', line ", at.line, ", column ", at.column, ": ", what));
  }
  static std::string describe(const Token& t) {
    switch (t.type) {
      case Tok::Eof:
        return "end of template";
      case Tok::BlockEnd:
        return "end of statement block";
      case Tok::VarEnd:
        return "end of print statement";
      case Tok::String:
        return "string";
      case Tok::Data:
        return "template data";
      default:
        return "'" + t.text + "'";
    }
  }
  bool is_op(const char* op) const { return cur().type == Tok::Operator && cur().text == op; }
  bool is_name(const char* n) const { return cur().type == Tok::Name && cur().text == n; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(const char* n) {
    if (!is_name(n)) return false;
    next();
    return true;
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) error(cur(), std::string("expected '") + op + "', got " + describe(cur()));
  }
  std::string expect_name() {
    if (cur().type != Tok::Name) error(cur(), "expected a name, got " + describe(cur()));
    return next().text;
  }
  void expect_block_end() {
    if (cur().type != Tok::BlockEnd) error(cur(), "expected end of statement block, got " + describe(cur()));
    next();
  }

  ExprPtr make(Expr::Type type, int line) {
    auto e = std::make_unique<Expr>();
    e->type = type;
    e->line = line;
    return e;
  }

  // Parses statements until a block tag whose name is in `end_tags`; leaves that name as the current token.
  Body parse_body(const std::vector<std::string>& end_tags) {
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.type == Tok::Eof) {
        if (!end_tags.empty())
          error(t, "unexpected end of template, expected '" + end_tags.back() + "' (a block is not closed)");
        return body;
      }
      if (t.type == Tok::Data) {
        auto s = std::make_unique<Stmt>();
        s->type = Stmt::Type::Text;
        s->line = t.line;
        s->text = t.text;
        body.push_back(std::move(s));
        next();
      } else if (t.type == Tok::VarBegin) {
        next();
        auto s = std::make_unique<Stmt>();
        s->type = Stmt::Type::Print;
        s->line = t.line;
        s->expr = parse_tuple(true);
        if (cur().type != Tok::VarEnd)
          error(cur(), "expected end of print statement, got " + describe(cur()));
        next();
        body.push_back(std::move(s));
      } else if (t.type == Tok::BlockBegin) {
        const Token& tag = peek();
        if (tag.type != Tok::Name) error(tag, "tag name expected");
        if (std::find(end_tags.begin(), end_tags.end(), tag.text) != end_tags.end()) {
          next();
          return body;
        }
        next();
        body.push_back(parse_statement());
      } else {
        error(t, "unexpected " + describe(t));
      }
    }
  }

  std::unique_ptr<Stmt> parse_statement() {
    const DepthGuard guard(*this);
    const Token tag = next();
    auto s = std::make_unique<Stmt>();
    s->line = tag.line;
    const std::string& name = tag.text;
    if (name == "if") {
      s->type = Stmt::Type::If;
      s->conditions.push_back(parse_tuple(false));
      expect_block_end();
      while (true) {
        s->bodies.push_back(parse_body({"elif", "else", "endif"}));
        const std::string which = next().text;
        if (which == "elif") {
          s->conditions.push_back(parse_tuple(false));
          expect_block_end();
        } else if (which == "else") {
          expect_block_end();
          s->else_body = parse_body({"endif"});
          next();
          expect_block_end();
          break;
        } else {
          expect_block_end();
          break;
        }
      }
    } else if (name == "for") {
      s->type = Stmt::Type::For;
      const bool paren = skip_op("(");
      s->targets.push_back(expect_name());
      while (skip_op(",")) {
        if (is_name("in") || is_op(")")) break;
        s->targets.push_back(expect_name());
      }
      if (paren) expect_op(")");
      if (!skip_name("in")) error(cur(), "expected 'in', got " + describe(cur()));
      s->expr = parse_tuple(false);
      if (skip_name("if")) s->filter = parse_expression(true);
      if (is_name("recursive")) error(cur(), "unsupported construct: recursive for loops");
      expect_block_end();
      ++loop_depth_;
      s->body = parse_body({"endfor", "else"});
      --loop_depth_;
      if (next().text == "else") {
        expect_block_end();
        s->else_body = parse_body({"endfor"});
        next();
      }
      expect_block_end();
    } else if (name == "set") {
      s->type = Stmt::Type::Set;
      s->targets.push_back(expect_name());
      if (skip_op(".")) {
        s->attr = expect_name();
      } else if (is_op(",")) {
        error(cur(), "unsupported construct: tuple assignment in set");
      }
      if (skip_op("=")) {
        s->expr = parse_tuple(true);
        expect_block_end();
      } else {
        if (!s->attr.empty()) error(cur(), "expected '=' after namespace attribute in set");
        if (is_op("|")) error(cur(), "unsupported construct: filtered block set");
        expect_block_end();
        s->block_set = true;
        s->body = parse_body({"endset"});
        next();
        expect_block_end();
      }
    } else if (name == "macro") {
      s->type = Stmt::Type::Macro;
      s->text = expect_name();
      expect_op("(");
      while (!is_op(")")) {
        if (!s->params.empty()) expect_op(",");
        if (is_op(")")) break;
        s->params.push_back(expect_name());
        s->defaults.push_back(skip_op("=") ? parse_expression(true) : nullptr);
      }
      expect_op(")");
      expect_block_end();
      s->body = parse_body({"endmacro"});
      next();
      if (cur().type == Tok::Name && cur().text == s->text) next();
      expect_block_end();
    } else if (name == "break" || name == "continue") {
      if (loop_depth_ == 0) error(tag, "'" + name + "' outside of a loop");
      s->type = name == "break" ? Stmt::Type::Break : Stmt::Type::Continue;
      expect_block_end();
    } else if (name == "generation") {
      s->type = Stmt::Type::Generation;
      expect_block_end();
      s->body = parse_body({"endgeneration"});
      next();
      expect_block_end();
    } else if (std::find(std::begin(kUnsupportedTags), std::end(kUnsupportedTags), name) !=
               std::end(kUnsupportedTags)) {
      error(tag, "unsupported construct: '" + name + "' tag");
    } else {
      error(tag, "Encountered unknown tag '" + name + "'");
    }
    return s;
  }

  // jinja2's parse_tuple: a bare comma list becomes a tuple.
  ExprPtr parse_tuple(bool with_condexpr) {
    const int line = cur().line;
    ExprPtr first = parse_expression(with_condexpr);
    if (!is_op(",")) return first;
    auto tuple = make(Expr::Type::Tuple, line);
    tuple->args.push_back(std::move(first));
    while (skip_op(",")) {
      if (cur().type == Tok::VarEnd || cur().type == Tok::BlockEnd || is_op(")")) break;
      tuple->args.push_back(parse_expression(with_condexpr));
    }
    return tuple;
  }

  ExprPtr parse_expression(bool with_condexpr) {
    if (!with_condexpr) return parse_or();
    ExprPtr expr = parse_or();
    while (is_name("if")) {
      const int line = next().line;
      auto cond = make(Expr::Type::CondExpr, line);
      ExprPtr test = parse_or();
      ExprPtr otherwise = skip_name("else") ? parse_expression(true) : nullptr;
      cond->args.push_back(std::move(test));
      cond->args.push_back(std::move(expr));
      cond->args.push_back(std::move(otherwise));
      expr = std::move(cond);
    }
    return expr;
  }

  ExprPtr binary(Expr::Type type, ExprPtr a, ExprPtr b, int line, std::string op = {}) {
    auto e = make(type, line);
    e->name = std::move(op);
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (is_name("or")) {
      const int line = next().line;
      left = binary(Expr::Type::Or, std::move(left), parse_and(), line);
    }
    return left;
  }
  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (is_name("and")) {
      const int line = next().line;
      left = binary(Expr::Type::And, std::move(left), parse_not(), line);
    }
    return left;
  }
  ExprPtr parse_not() {
    const DepthGuard guard(*this);
    if (is_name("not")) {
      auto e = make(Expr::Type::Not, next().line);
      e->args.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    const int line = cur().line;
    ExprPtr first = parse_math1();
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (cur().type == Tok::Operator && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                          cur().text == "<=" || cur().text == ">" || cur().text == ">=")) {
        op = next().text;
      } else if (is_name("in")) {
        next();
        op = "in";
      } else if (is_name("not") && peek().type == Tok::Name && peek().text == "in") {
        next();
        next();
        op = "notin";
      } else {
        break;
      }
      if (!cmp) {
        cmp = make(Expr::Type::Compare, line);
        cmp->args.push_back(std::move(first));
      }
      cmp->ops.push_back(op);
      cmp->args.push_back(parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(first);
  }
  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token op = next();
      left = binary(Expr::Type::Binary, std::move(left), parse_concat(), op.line, op.text);
    }
    return left;
  }
  ExprPtr parse_concat() {
    ExprPtr left = parse_math2();
    while (is_op("~")) {
      const Token op = next();
      left = binary(Expr::Type::Binary, std::move(left), parse_math2(), op.line, "~");
    }
    return left;
  }
  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token op = next();
      left = binary(Expr::Type::Binary, std::move(left), parse_pow(), op.line, op.text);
    }
    return left;
  }
  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (is_op("**")) {
      const Token op = next();
      left = binary(Expr::Type::Binary, std::move(left), parse_unary(true), op.line, "**");
    }
    return left;
  }
  ExprPtr parse_unary(bool with_filter) {
    const DepthGuard guard(*this);
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      const Token op = next();
      node = make(op.text == "-" ? Expr::Type::Neg : Expr::Type::Pos, op.line);
      node->args.push_back(parse_unary(false));
      node = fold_negative_literal(std::move(node));
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  // jinja2 folds `-<number>` into a constant, which it later writes into Python source bare: `-2 ** x` then
  // means -(2 ** x) when x is not a constant. The fold is marked (negated) so the interpreter can do the
  // same.
  ExprPtr fold_negative_literal(ExprPtr neg) {
    if (neg->type != Expr::Type::Neg) return neg;
    const Expr& inner = *neg->args[0];
    if (inner.type != Expr::Type::Literal) return neg;
    if (inner.value.kind == Kind::Int && inner.value.integer != INT64_MIN) {
      neg->value = Value::from_int(-inner.value.integer);
    } else if (inner.value.kind == Kind::Float) {
      neg->value = Value::from_float(-inner.value.real);
    } else {
      return neg;
    }
    neg->type = Expr::Type::Literal;
    neg->negated = true;
    neg->args.clear();
    return neg;
  }

  ExprPtr parse_primary() {
    const Token t = cur();
    switch (t.type) {
      case Tok::Name: {
        next();
        if (t.text == "true" || t.text == "True" || t.text == "false" || t.text == "False") {
          auto e = make(Expr::Type::Literal, t.line);
          e->value = Value::from_bool(t.text[0] == 't' || t.text[0] == 'T');
          return e;
        }
        if (t.text == "none" || t.text == "None") {
          auto e = make(Expr::Type::Literal, t.line);
          e->value = Value::none();
          return e;
        }
        auto e = make(Expr::Type::Name, t.line);
        e->name = t.text;
        // What the name evaluates to when unbound, made once here rather than on every evaluation.
        e->value = Value::undefined("'" + t.text + "' is undefined");
        return e;
      }
      case Tok::String: {
        std::string text;
        while (cur().type == Tok::String) text += next().text;
        auto e = make(Expr::Type::Literal, t.line);
        e->value = Value::from_string(std::move(text));
        return e;
      }
      case Tok::Integer: {
        next();
        errno = 0;
        const long long v = std::strtoll(t.text.c_str(), nullptr, 10);
        if (errno == ERANGE) error(t, "integer literal " + t.text + " does not fit in 64 bits");
        auto e = make(Expr::Type::Literal, t.line);
        e->value = Value::from_int(v);
        return e;
      }
      case Tok::Float: {
        next();
        auto e = make(Expr::Type::Literal, t.line);
        e->value = Value::from_float(std::strtod(t.text.c_str(), nullptr));
        return e;
      }
      case Tok::Operator:
        if (t.text == "(") {
          next();
          if (skip_op(")")) return make(Expr::Type::Tuple, t.line);
          ExprPtr inner = parse_tuple(true);
          expect_op(")");
          return inner;
        }
        if (t.text == "[") {
          next();
          auto e = make(Expr::Type::List, t.line);
          while (!is_op("]")) {
            if (!e->args.empty()) expect_op(",");
            if (is_op("]")) break;
            e->args.push_back(parse_expression(true));
          }
          expect_op("]");
          return e;
        }
        if (t.text == "{") {
          next();
          auto e = make(Expr::Type::Dict, t.line);
          while (!is_op("}")) {
            if (!e->args.empty()) expect_op(",");
            if (is_op("}")) break;
            e->args.push_back(parse_expression(true));
            expect_op(":");
            e->values.push_back(parse_expression(true));
          }
          expect_op("}");
          return e;
        }
        break;
      default:
        break;
    }
    error(t, "unexpected " + describe(t));
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      if (is_op(".")) {
        const int line = next().line;
        const Token t = next();
        if (t.type == Tok::Name) {
          auto e = make(Expr::Type::Attr, line);
          e->name = t.text;
          e->args.push_back(std::move(node));
          node = std::move(e);
        } else if (t.type == Tok::Integer) {
          auto e = make(Expr::Type::Item, line);
          e->args.push_back(std::move(node));
          auto key = make(Expr::Type::Literal, line);
          key->value = Value::from_int(std::strtoll(t.text.c_str(), nullptr, 10));
          e->args.push_back(std::move(key));
          node = std::move(e);
        } else {
          error(t, "expected name or number after '.'");
        }
      } else if (is_op("[")) {
        node = parse_subscript(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node), Expr::Type::Call, "");
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr node) {
    const int line = next().line;  // '['
    ExprPtr parts[3];
    bool is_slice = false;
    if (!is_op(":")) parts[0] = parse_expression(true);
    if (skip_op(":")) {
      is_slice = true;
      if (!is_op("]") && !is_op(":")) parts[1] = parse_expression(true);
      if (skip_op(":") && !is_op("]")) parts[2] = parse_expression(true);
    }
    if (is_op(",")) error(cur(), "unsupported construct: tuple subscripts");
    expect_op("]");
    auto e = make(is_slice ? Expr::Type::Slice : Expr::Type::Item, line);
    e->args.push_back(std::move(node));
    for (int i = 0; i < (is_slice ? 3 : 1); ++i) e->args.push_back(std::move(parts[i]));
    return e;
  }

  // Arguments in parentheses: positional then keyword (`name=value`), appended to `e`.
  void parse_call_args(Expr& e) {
    expect_op("(");
    bool first = true;
    while (!is_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (is_op(")")) break;
      if (is_op("*") || is_op("**")) error(cur(), "unsupported construct: *args / **kwargs in calls");
      if (cur().type == Tok::Name && peek().type == Tok::Operator && peek().text == "=") {
        std::string key = next().text;
        next();
        e.kwargs.emplace_back(std::move(key), parse_expression(true));
      } else {
        if (!e.kwargs.empty()) error(cur(), "invalid syntax for function call expression");
        e.args.push_back(parse_expression(true));
      }
    }
    expect_op(")");
  }

  ExprPtr parse_call(ExprPtr callee, Expr::Type type, std::string name) {
    auto e = make(type, cur().line);
    e->name = std::move(name);
    e->args.push_back(std::move(callee));
    parse_call_args(*e);
    return e;
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    while (true) {
      if (is_op("|")) {
        const int line = next().line;
        std::string fname = expect_name();
        while (skip_op(".")) fname += "." + expect_name();
        if (is_op("(")) {
          node = parse_call(std::move(node), Expr::Type::Filter, fname);
        } else {
          auto e = make(Expr::Type::Filter, line);
          e->name = fname;
          e->args.push_back(std::move(node));
          node = std::move(e);
        }
      } else if (is_name("is")) {
        const int line = next().line;
        const bool negated = skip_name("not");
        std::string tname = expect_name();
        while (skip_op(".")) tname += "." + expect_name();
        ExprPtr e;
        if (is_op("(")) {
          e = parse_call(std::move(node), Expr::Type::Test, tname);
        } else {
          e = make(Expr::Type::Test, line);
          e->name = tname;
          e->args.push_back(std::move(node));
          const Token& c = cur();
          const bool arg_follows =
              (c.type == Tok::Name || c.type == Tok::String || c.type == Tok::Integer ||
               c.type == Tok::Float || (c.type == Tok::Operator && (c.text == "[" || c.text == "{"))) &&
              !(c.type == Tok::Name && (c.text == "else" || c.text == "or" || c.text == "and"));
          if (arg_follows) {
            if (is_name("is")) error(cur(), "You cannot chain multiple tests with is");
            e->args.push_back(parse_postfix(parse_primary()));
          }
        }
        e->negated = negated;
        node = std::move(e);
      } else if (is_op("(")) {
        node = parse_call(std::move(node), Expr::Type::Call, "");
      } else {
        return node;
      }
    }
  }

  // Nesting (of blocks and of expressions) is bounded so hostile input ends in an error, not a stack
  // overflow.
  static constexpr int kMaxNesting = 200;
  struct DepthGuard {
    explicit DepthGuard(Parser& p) : parser(p) {
      if (++parser.nesting_ > kMaxNesting)
        parser.error(parser.cur(), "template nests deeper than " + std::to_string(kMaxNesting) + " levels");
    }
    ~DepthGuard() { --parser.nesting_; }
    Parser& parser;
  };

  std::vector<Token> toks_;
  const std::string& name_;
  int nesting_ = 0;
  size_t pos_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

std::unique_ptr<Program> parse_program(const std::string& source, const std::string& name) {
  auto program = std::make_unique<Program>();
  program->name = name;
  Parser parser(tokenize(source, name), name);
  program->body = parser.parse_all();
  return program;
}

}  // namespace xmoe::jinja
