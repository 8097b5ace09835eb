// The values a template computes with, modelled on the Python objects jinja2 would hold: printing,
// truthiness, equality and JSON conversion follow Python so rendered text is byte-identical.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace xmoe::jinja {

// Raised while rendering; the interpreter adds the template name and line before it leaves the engine.
struct TemplateFailure {
  std::string kind;  // Python exception type it stands for: TemplateError, UndefinedError, TypeError, ...
  std::string message;
  int line = 0;
};
[[noreturn]] void fail(const std::string& kind, const std::string& message);

// Values nest at most this deep (Python's own recursion limit stops deeper nesting in jinja2 too); it keeps
// printing, comparison and destruction off the edge of the C++ stack.
constexpr uint32_t kMaxValueDepth = 400;
// Strings and lists a template builds are capped (MemoryError), so a hostile template cannot allocate without
// bound by doubling a string or list in a loop; chat prompts are far smaller.
constexpr size_t kMaxStringBytes = size_t{64} << 20;
constexpr size_t kMaxListItems = size_t{1} << 22;
// What one list item or dict entry counts for in a value's weight, in bytes (a Value and its bookkeeping).
constexpr uint64_t kItemWeight = 16;

struct Value;
using List = std::vector<Value>;

// Python dict of str keys, insertion ordered (small, so lookups are linear).
struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  const Value* find(const std::string& key) const;
  void set(const std::string& key, Value value);
};

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};
struct Callable {
  std::string name;
  std::function<Value(CallArgs&)> call;
};

enum class Kind { Undefined, None, Bool, Int, Float, String, List, Dict, Namespace, Callable };

struct Value {
  Kind kind = Kind::Undefined;
  bool boolean = false;
  int64_t integer = 0;
  double real = 0;
  std::shared_ptr<const std::string> str;  // String; for Undefined: the message using it would raise
  std::shared_ptr<const List> list;
  std::shared_ptr<const Dict> dict;
  std::shared_ptr<Dict> ns;  // Namespace attributes (the one mutable container templates may touch)
  std::shared_ptr<const Callable> fn;
  uint32_t depth = 0;  // nesting of lists / dicts / namespaces below this value
  // Deep size in bytes: a string's bytes, plus kItemWeight per list item or dict entry, nested values
  // included (saturating; a namespace counts its attributes when made). The interpreter charges scans by it.
  uint64_t weight = 0;
  bool tuple = false;  // a List Python would hold as a tuple: prints as "(a, b)", never equals a list
  bool safe = false;   // Markup: only tracked so the `safe` filter is an identity
  bool undefined_unsafe = false;  // Undefined standing for a sandbox violation (SecurityError when used)

  static Value undefined(std::string message, bool unsafe = false);
  static Value none();
  static Value from_bool(bool b);
  static Value from_int(int64_t i);
  static Value from_float(double f);
  static Value from_string(std::string s);
  static Value from_list(List items);
  static Value from_tuple(List items);
  static Value from_dict(Dict d);
  // A dict the caller keeps a mutable handle on: it may change it only while no Value shares it.
  static Value from_shared_dict(std::shared_ptr<const Dict> d);
  static Value new_namespace(Dict attrs);
  static Value from_callable(std::string name, std::function<Value(CallArgs&)> fn);

  bool is_undefined() const { return kind == Kind::Undefined; }
  bool is_string() const { return kind == Kind::String; }
  bool is_number() const { return kind == Kind::Int || kind == Kind::Float || kind == Kind::Bool; }
  const std::string& s() const { return *str; }
  // Raises the UndefinedError (or SecurityError) an operation on this Undefined causes in jinja2.
  [[noreturn]] void raise_undefined() const;
};

// The weight of the value itself without what it holds: a string's bytes, kItemWeight per item or entry of a
// list, dict or namespace; what copying it (not its items) costs.
uint64_t shallow_weight(const Value& v);

// Python str(value): what {{ value }} prints (Undefined prints nothing).
std::string to_str(const Value& v);
// Python repr(value), used for items inside printed lists and dicts.
std::string to_repr(const Value& v);
bool truthy(const Value& v);
bool equals(const Value& a, const Value& b);
// Python's type name for error messages: "str", "int", "list", "dict", "NoneType", ...
std::string type_name(const Value& v);
// jinja2's object_type_repr: "dict object", "None", ...
std::string object_type_repr(const Value& v);
// float.__repr__: shortest round-trip digits, exponent form outside [1e-4, 1e16).
std::string float_repr(double d);

Value from_json(const nlohmann::ordered_json& j);

struct JsonDumpOptions {
  bool ensure_ascii = false;
  int indent = -1;  // < 0: single line
  std::string item_separator;
  std::string key_separator;
  bool sort_keys = false;
};
// json.dumps(value, ...) with Python's output format.
std::string json_dumps(const Value& v, const JsonDumpOptions& options);

}  // namespace xmoe::jinja
