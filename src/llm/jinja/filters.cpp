// jinja2's built-in filters that chat templates use, with transformers' tojson.
#include <climits>
#include <cmath>
#include <cstdlib>

#include "args.hpp"
#include "builtins.hpp"
#include "operators.hpp"
#include "pystr.hpp"

namespace xmoe::jinja {
namespace {

// int(float): truncation; NaN, infinities and values beyond 64 bits give the filter's default.
Value float_to_int(double d, const Value& fallback) {
  if (!std::isfinite(d) || d >= 9.2233720368547758e18 || d < -9.2233720368547758e18) return fallback;
  return Value::from_int(static_cast<int64_t>(d));
}

JsonDumpOptions json_options(const Args& args) {
  // transformers' tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
  JsonDumpOptions o;
  o.ensure_ascii = truthy(args.get_or(1, Value::from_bool(false)));
  const Value indent = args.get_or(2, Value::none());
  if (indent.kind == Kind::Int)
    o.indent = static_cast<int>(std::max<int64_t>(indent.integer, 0));
  else if (indent.kind != Kind::None)
    fail("TypeError", "tojson: indent must be an integer or None");
  o.item_separator = o.indent >= 0 ? "," : ", ";
  o.key_separator = ": ";
  const Value separators = args.get_or(3, Value::none());
  if (separators.kind == Kind::List && separators.list->size() == 2 && (*separators.list)[0].is_string() &&
      (*separators.list)[1].is_string()) {
    o.item_separator = (*separators.list)[0].s();
    o.key_separator = (*separators.list)[1].s();
  } else if (separators.kind != Kind::None) {
    fail("TypeError", "tojson: separators must be a pair of strings");
  }
  o.sort_keys = truthy(args.get_or(4, Value::from_bool(false)));
  return o;
}

// select / reject / selectattr / rejectattr
Value select_items(const std::string& fname, const Value& target, CallArgs& call, bool by_attribute,
                   bool keep) {
  CallArgs rest;
  size_t first_test_arg = by_attribute ? 2 : 1;
  if (by_attribute && call.positional.empty()) fail("TypeError", fname + "() missing the attribute argument");
  std::string test = call.positional.size() >= first_test_arg ? "" : "truthy";
  if (test.empty()) {
    const Value& t = call.positional[first_test_arg - 1];
    if (t.kind != Kind::String) fail("TypeError", fname + "(): the test name must be a string");
    test = t.s();
  }
  for (size_t i = first_test_arg; i < call.positional.size(); ++i)
    rest.positional.push_back(call.positional[i]);
  rest.keyword = call.keyword;
  List out;
  for (const Value& item : iterate(target)) {
    const Value subject = by_attribute ? get_attribute(item, to_str(call.positional[0])) : item;
    CallArgs args = rest;
    const bool ok = test == "truthy" ? truthy(subject) : apply_test(test, subject, args);
    if (ok == keep) out.push_back(item);
  }
  return Value::from_list(std::move(out));
}

}  // namespace

Value apply_filter(const std::string& name, const Value& target, CallArgs& call) {
  if (name == "tojson") {
    CallArgs shifted;
    shifted.positional.push_back(target);
    shifted.positional.insert(shifted.positional.end(), call.positional.begin(), call.positional.end());
    shifted.keyword = call.keyword;
    Args bound("tojson", shifted, {"x", "ensure_ascii", "indent", "separators", "sort_keys"});
    if (target.is_undefined()) fail("TypeError", "Object of type Undefined is not JSON serializable");
    return Value::from_string(json_dumps(target, json_options(bound)));
  }
  if (name == "length" || name == "count") {
    Args args(name, call, {});
    return Value::from_int(length_of(target));
  }
  if (name == "string") {
    Args args(name, call, {});
    return Value::from_string(to_str(target));
  }
  if (name == "safe") {
    Args args(name, call, {});
    Value v = Value::from_string(to_str(target));
    v.safe = true;
    return v;
  }
  if (name == "trim") {
    Args args(name, call, {"chars"});
    return Value::from_string(pystr::strip(to_str(target), args.opt_string(0), true, true));
  }
  if (name == "upper" || name == "lower") {
    Args args(name, call, {});
    return Value::from_string(name == "upper" ? pystr::upper(to_str(target)) : pystr::lower(to_str(target)));
  }
  if (name == "capitalize") {
    Args args(name, call, {});
    const std::u32string text = pystr::decode(to_str(target));
    if (text.empty()) return Value::from_string("");
    return Value::from_string(pystr::upper(pystr::encode(text.substr(0, 1))) +
                              pystr::lower(pystr::encode(text.substr(1))));
  }
  if (name == "replace") {
    Args args(name, call, {"old", "new", "count"});
    return Value::from_string(
        pystr::replace(to_str(target), args.str(0), args.str(1), static_cast<long>(args.integer(2, -1))));
  }
  if (name == "escape" || name == "e") {
    Args args(name, call, {});
    if (target.safe) return target;
    Value v = Value::from_string(pystr::html_escape(to_str(target)));
    v.safe = true;
    return v;
  }
  if (name == "items") {
    Args args(name, call, {});
    if (target.is_undefined()) return Value::from_list({});
    if (target.kind != Kind::Dict) fail("TypeError", "Can only get item pairs from a mapping.");
    List out;
    for (const auto& [k, v] : target.dict->items)
      out.push_back(Value::from_tuple({Value::from_string(k), v}));
    return Value::from_list(std::move(out));
  }
  if (name == "list") {
    Args args(name, call, {});
    return Value::from_list(iterate(target));
  }
  if (name == "join") {
    Args args(name, call, {"d", "attribute"});
    const std::string sep = args.has(0) ? to_str(args.get(0)) : "";
    std::string out;
    bool first = true;
    for (const Value& item : iterate(target)) {
      if (!first) out += sep;
      out += to_str(args.has(1) ? get_attribute(item, to_str(args.get(1))) : item);
      first = false;
    }
    return Value::from_string(std::move(out));
  }
  if (name == "first" || name == "last") {
    Args args(name, call, {});
    const List items = iterate(target);
    if (items.empty()) return Value::undefined("No " + name + " item, sequence was empty.");
    return name == "first" ? items.front() : items.back();
  }
  if (name == "default" || name == "d") {
    Args args(name, call, {"default_value", "boolean"});
    const bool boolean = truthy(args.get_or(1, Value::from_bool(false)));
    if (target.is_undefined() || (boolean && !truthy(target))) return args.get_or(0, Value::from_string(""));
    return target;
  }
  if (name == "int") {
    Args args(name, call, {"default", "base"});
    const Value fallback = args.get_or(0, Value::from_int(0));
    if (target.is_undefined()) target.raise_undefined();  // int(Undefined) raises in jinja2
    if (target.kind == Kind::Int) return target;
    if (target.kind == Kind::Bool) return Value::from_int(target.boolean);
    if (target.kind == Kind::Float) return float_to_int(target.real, fallback);
    if (target.kind == Kind::String) {
      const std::string s = pystr::strip(target.s(), std::nullopt, true, true);
      char* end = nullptr;
      const long long v = std::strtoll(s.c_str(), &end, 10);
      if (!s.empty() && end && *end == 0) return Value::from_int(v);
      const double d = std::strtod(s.c_str(), &end);
      if (!s.empty() && end && *end == 0) return float_to_int(d, fallback);
    }
    return fallback;
  }
  if (name == "float") {
    Args args(name, call, {"default"});
    if (target.is_undefined()) target.raise_undefined();
    if (target.is_number())
      return Value::from_float(target.kind == Kind::Float ? target.real
                               : target.kind == Kind::Int ? static_cast<double>(target.integer)
                                                          : target.boolean);
    if (target.kind == Kind::String) {
      const std::string s = pystr::strip(target.s(), std::nullopt, true, true);
      char* end = nullptr;
      const double d = std::strtod(s.c_str(), &end);
      if (!s.empty() && end && *end == 0) return Value::from_float(d);
    }
    return args.get_or(0, Value::from_float(0.0));
  }
  if (name == "abs") {
    Args args(name, call, {});
    if (target.kind == Kind::Float) return Value::from_float(std::fabs(target.real));
    if (target.kind == Kind::Int || target.kind == Kind::Bool) {
      const int64_t v = target.kind == Kind::Int ? target.integer : target.boolean;
      if (v == INT64_MIN) fail("OverflowError", "integer result does not fit in 64 bits");
      return Value::from_int(v < 0 ? -v : v);
    }
    fail("TypeError", "bad operand type for abs(): '" + type_name(target) + "'");
  }
  if (name == "select" || name == "reject") return select_items(name, target, call, false, name == "select");
  if (name == "selectattr" || name == "rejectattr")
    return select_items(name, target, call, true, name == "selectattr");
  if (name == "map") {
    List out;
    if (call.positional.empty()) {
      Args args("map", call, {"attribute", "default"});
      const std::string attribute = to_str(args.get(0));
      for (const Value& item : iterate(target)) {
        Value v = get_attribute(item, attribute);
        out.push_back(v.is_undefined() && args.has(1) ? args.get(1) : v);
      }
    } else {
      if (call.positional[0].kind != Kind::String)
        fail("TypeError", "map(): the filter name must be a string");
      const std::string filter = call.positional[0].s();
      for (const Value& item : iterate(target)) {
        CallArgs rest;
        rest.positional.assign(call.positional.begin() + 1, call.positional.end());
        rest.keyword = call.keyword;
        out.push_back(apply_filter(filter, item, rest));
      }
    }
    return Value::from_list(std::move(out));
  }
  fail("TemplateRuntimeError", "No filter named '" + name + "' found.");
}

}  // namespace xmoe::jinja
