// jinja2's built-in tests (`x is defined`, `x is mapping`, ...).
#include "args.hpp"
#include "builtins.hpp"
#include "operators.hpp"
#include "pystr.hpp"

namespace xmoe::jinja {

bool apply_test(const std::string& name, const Value& v, CallArgs& call) {
  auto no_args = [&] { Args args(name, call, {}); };
  auto one_arg = [&]() -> Value {
    Args args(name, call, {"other"});
    return args.get(0);
  };
  if (name == "defined") return no_args(), !v.is_undefined();
  if (name == "undefined") return no_args(), v.is_undefined();
  if (name == "none") return no_args(), v.kind == Kind::None;
  if (name == "string") return no_args(), v.kind == Kind::String;
  if (name == "mapping") return no_args(), v.kind == Kind::Dict;
  if (name == "number") return no_args(), v.is_number();
  if (name == "integer") return no_args(), v.kind == Kind::Int;
  if (name == "float") return no_args(), v.kind == Kind::Float;
  if (name == "boolean") return no_args(), v.kind == Kind::Bool;
  if (name == "true") return no_args(), v.kind == Kind::Bool && v.boolean;
  if (name == "false") return no_args(), v.kind == Kind::Bool && !v.boolean;
  // jinja2's Undefined defines __call__ (to raise), so it counts as callable.
  if (name == "callable") return no_args(), v.kind == Kind::Callable || v.is_undefined();
  // iter() succeeds on str, list, dict and on jinja2's Undefined (which iterates as empty).
  if (name == "iterable")
    return no_args(),
           v.kind == Kind::String || v.kind == Kind::List || v.kind == Kind::Dict || v.is_undefined();
  // len() and __getitem__ both exist: str, list, dict, and Undefined again.
  if (name == "sequence")
    return no_args(),
           v.kind == Kind::String || v.kind == Kind::List || v.kind == Kind::Dict || v.is_undefined();
  if (name == "lower" || name == "upper") {
    // str.islower() / isupper(): at least one cased character, and none of the other case.
    no_args();
    const std::string text = to_str(v);
    const std::string lowered = pystr::lower(text), uppered = pystr::upper(text);
    return lowered != uppered && text == (name == "lower" ? lowered : uppered);
  }
  if (name == "odd" || name == "even") {
    no_args();
    if (v.kind == Kind::String) fail("TypeError", "not all arguments converted during string formatting");
    return equals(binary_op("%", v, Value::from_int(2)), Value::from_int(name == "odd" ? 1 : 0));
  }
  if (name == "divisibleby") {
    const Value d = one_arg();
    if (v.kind == Kind::String) fail("TypeError", "not all arguments converted during string formatting");
    return equals(binary_op("%", v, d), Value::from_int(0));
  }
  if (name == "escaped") return no_args(), v.safe;
  if (name == "sameas") {
    const Value other = one_arg();
    if (v.kind != other.kind) return false;
    if (v.kind == Kind::None || v.kind == Kind::Undefined) return true;
    if (v.kind == Kind::Bool) return v.boolean == other.boolean;
    return equals(v, other) && (v.kind == Kind::Int || v.list == other.list || v.dict == other.dict ||
                                v.ns == other.ns || v.str == other.str);
  }
  static const std::pair<const char*, const char*> comparisons[] = {
      {"equalto", "=="},    {"eq", "=="}, {"==", "=="}, {"ne", "!="}, {"!=", "!="}, {"lt", "<"},
      {"lessthan", "<"},    {"<", "<"},   {"le", "<="}, {"<=", "<="}, {"gt", ">"},  {">", ">"},
      {"greaterthan", ">"}, {"ge", ">="}, {">=", ">="}, {"in", "in"}};
  for (const auto& [test, op] : comparisons)
    if (name == test) return compare(op, v, one_arg());
  fail("TemplateRuntimeError", "No test named '" + name + "' found.");
}

}  // namespace xmoe::jinja
