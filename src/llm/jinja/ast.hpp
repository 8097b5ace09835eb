// Parsed template: expressions and statements of the Jinja subset, each carrying its source line.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "value.hpp"

namespace xmoe::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Type {
    Literal,   // value
    Name,      // name
    Attr,      // args[0].name
    Item,      // args[0][args[1]]
    Slice,     // args[0][args[1]:args[2]:args[3]] (null parts absent)
    Call,      // args[0](args[1..], kwargs)
    Filter,    // args[0] | name(args[1..], kwargs)
    Test,      // args[0] is [not] name(args[1..], kwargs)
    Neg,       // -args[0]
    Pos,       // +args[0]
    Not,       // not args[0]
    And,       // args[0] and args[1]
    Or,        // args[0] or args[1]
    Binary,    // args[0] <name> args[1]: + - * / // % ** ~
    Compare,   // args[0] ops[0] args[1] ops[1] args[2] ...
    CondExpr,  // args[1] if args[0] else args[2] (args[2] may be null)
    List,      // [args...]
    Tuple,     // (args...)
    Dict,      // {kwargs...} with expression keys in args (key i = args[i], value i = values[i])
  };
  Type type;
  int line = 0;
  Value value;  // Literal: the value; Name: the Undefined it evaluates to when unbound
  std::string name;
  bool negated = false;  // Test: `is not`; Literal: a folded `-<number>`
  std::vector<ExprPtr> args;
  std::vector<ExprPtr> values;  // Dict values
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;
};

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;

struct Stmt {
  enum class Type {
    Text,   // text
    Print,  // {{ expr }}
    If,     // conditions[i] → bodies[i]; else_body
    For,    // for targets in expr [if filter] body [else else_body]
    Set,    // set targets[0] (or targets[0].attr when attr non-empty) = expr; or block set into body
    Macro,  // macro name(params = defaults) body
    Break,
    Continue,
    Generation,  // {% generation %} body {% endgeneration %}
  };
  Type type;
  int line = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr filter;
  std::vector<ExprPtr> conditions;
  std::vector<Body> bodies;
  Body body;
  Body else_body;
  std::vector<std::string> targets;
  std::string attr;
  bool block_set = false;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // aligned with params; null when the parameter has no default
};

struct Program {
  std::string name;
  Body body;
};

}  // namespace xmoe::jinja
