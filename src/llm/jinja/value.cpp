#include "value.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "pystr.hpp"

namespace xmoe::jinja {

void fail(const std::string& kind, const std::string& message) {
  throw TemplateFailure{kind, message, 0};
}

const Value* Dict::find(const std::string& key) const {
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

void Dict::set(const std::string& key, Value value) {
  for (auto& [k, v] : items)
    if (k == key) {
      v = std::move(value);
      return;
    }
  items.emplace_back(key, std::move(value));
}

Value Value::undefined(std::string message, bool unsafe) {
  Value v;
  v.str = std::make_shared<const std::string>(std::move(message));
  v.undefined_unsafe = unsafe;
  return v;
}
Value Value::none() {
  Value v;
  v.kind = Kind::None;
  return v;
}
Value Value::from_bool(bool b) {
  Value v;
  v.kind = Kind::Bool;
  v.boolean = b;
  return v;
}
Value Value::from_int(int64_t i) {
  Value v;
  v.kind = Kind::Int;
  v.integer = i;
  return v;
}
Value Value::from_float(double f) {
  Value v;
  v.kind = Kind::Float;
  v.real = f;
  return v;
}
Value Value::from_string(std::string s) {
  if (s.size() > kMaxStringBytes)
    fail("MemoryError", "a string of " + std::to_string(s.size()) + " bytes exceeds the limit of " +
                            std::to_string(kMaxStringBytes));
  Value v;
  v.kind = Kind::String;
  v.weight = s.size();
  v.str = std::make_shared<const std::string>(std::move(s));
  return v;
}
namespace {
uint64_t saturating_add(uint64_t a, uint64_t b) {
  return b > UINT64_MAX - a ? UINT64_MAX : a + b;
}
uint64_t weight_of(const List& items) {
  uint64_t w = 0;
  for (const Value& item : items) w = saturating_add(w, saturating_add(item.weight, kItemWeight));
  return w;
}
uint64_t weight_of(const Dict& d) {
  uint64_t w = 0;
  for (const auto& [k, v] : d.items) w = saturating_add(w, saturating_add(v.weight, k.size() + kItemWeight));
  return w;
}
uint32_t nesting_of(const List& items) {
  if (items.size() > kMaxListItems)
    fail("MemoryError", "a list of " + std::to_string(items.size()) + " items exceeds the limit of " +
                            std::to_string(kMaxListItems));
  uint32_t depth = 0;
  for (const Value& item : items) depth = std::max(depth, item.depth);
  if (depth + 1 > kMaxValueDepth)
    fail("RecursionError", "values nest deeper than " + std::to_string(kMaxValueDepth) + " levels");
  return depth + 1;
}
uint32_t nesting_of(const Dict& d) {
  uint32_t depth = 0;
  for (const auto& item : d.items) depth = std::max(depth, item.second.depth);
  if (depth + 1 > kMaxValueDepth)
    fail("RecursionError", "values nest deeper than " + std::to_string(kMaxValueDepth) + " levels");
  return depth + 1;
}
}  // namespace

Value Value::from_list(List items) {
  Value v;
  v.kind = Kind::List;
  v.depth = nesting_of(items);
  v.weight = weight_of(items);
  v.list = std::make_shared<const List>(std::move(items));
  return v;
}
Value Value::from_tuple(List items) {
  Value v = from_list(std::move(items));
  v.tuple = true;
  return v;
}
Value Value::from_dict(Dict d) {
  Value v;
  v.kind = Kind::Dict;
  v.depth = nesting_of(d);
  v.weight = weight_of(d);
  v.dict = std::make_shared<const Dict>(std::move(d));
  return v;
}
Value Value::from_shared_dict(std::shared_ptr<const Dict> d) {
  Value v;
  v.kind = Kind::Dict;
  v.depth = nesting_of(*d);
  v.weight = weight_of(*d);
  v.dict = std::move(d);
  return v;
}
Value Value::new_namespace(Dict attrs) {
  Value v;
  v.kind = Kind::Namespace;
  v.depth = nesting_of(attrs);
  v.weight = weight_of(attrs);
  v.ns = std::make_shared<Dict>(std::move(attrs));
  return v;
}
Value Value::from_callable(std::string name, std::function<Value(CallArgs&)> fn) {
  Value v;
  v.kind = Kind::Callable;
  v.fn = std::make_shared<const Callable>(Callable{std::move(name), std::move(fn)});
  return v;
}

uint64_t shallow_weight(const Value& v) {
  switch (v.kind) {
    case Kind::String:
      return v.str->size();
    case Kind::List:
      return v.list->size() * kItemWeight;
    case Kind::Dict:
      return v.dict->items.size() * kItemWeight;
    case Kind::Namespace:
      return v.ns->items.size() * kItemWeight;
    default:
      return 0;
  }
}

void Value::raise_undefined() const {
  fail(undefined_unsafe ? "SecurityError" : "UndefinedError", str ? *str : std::string("undefined value"));
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  // Shortest round-trip digits in scientific form, then laid out the way float.__repr__ does.
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  const bool negative = sci[0] == '-';
  if (negative) sci.erase(0, 1);
  const size_t e_pos = sci.find('e');
  const int exponent = std::stoi(sci.substr(e_pos + 1));
  std::string digits;
  for (size_t i = 0; i < e_pos; ++i)
    if (sci[i] != '.') digits.push_back(sci[i]);
  std::string out = negative ? "-" : "";
  if (exponent < -4 || exponent >= 16) {
    out += digits[0];
    if (digits.size() > 1) out += "." + digits.substr(1);
    char exp_buf[16];
    std::snprintf(exp_buf, sizeof exp_buf, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    out += exp_buf;
  } else if (exponent < 0) {
    out += "0." + std::string(static_cast<size_t>(-exponent - 1), '0') + digits;
  } else {
    const auto int_digits = static_cast<size_t>(exponent + 1);
    if (digits.size() <= int_digits) {
      out += digits + std::string(int_digits - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, int_digits) + "." + digits.substr(int_digits);
    }
  }
  return out;
}

std::string to_str(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined:
      return "";
    case Kind::String:
      return *v.str;
    default:
      return to_repr(v);
  }
}

namespace {
std::string repr_at(const Value& v, int level);
}

std::string to_repr(const Value& v) {
  return repr_at(v, 0);
}

namespace {
std::string repr_at(const Value& v, int level) {
  // Namespaces are shared references, so a template can make one contain itself.
  if (level > static_cast<int>(kMaxValueDepth))
    fail("RecursionError", "maximum recursion depth exceeded while getting the repr of an object");
  switch (v.kind) {
    case Kind::Undefined:
      return "Undefined";
    case Kind::None:
      return "None";
    case Kind::Bool:
      return v.boolean ? "True" : "False";
    case Kind::Int:
      return std::to_string(v.integer);
    case Kind::Float:
      return float_repr(v.real);
    case Kind::String:
      return v.safe ? "Markup(" + pystr::repr(*v.str) + ")" : pystr::repr(*v.str);
    case Kind::List: {
      std::string out = v.tuple ? "(" : "[";
      for (size_t i = 0; i < v.list->size(); ++i) out += (i ? ", " : "") + repr_at((*v.list)[i], level + 1);
      if (v.tuple && v.list->size() == 1) out += ",";
      return out + (v.tuple ? ")" : "]");
    }
    case Kind::Dict:
    case Kind::Namespace: {
      const Dict& d = v.kind == Kind::Dict ? *v.dict : *v.ns;
      std::string out = "{";
      for (size_t i = 0; i < d.items.size(); ++i)
        out += (i ? ", " : "") + pystr::repr(d.items[i].first) + ": " + repr_at(d.items[i].second, level + 1);
      out += "}";
      return v.kind == Kind::Dict ? out : "<Namespace " + out + ">";
    }
    case Kind::Callable:
      return "<function " + v.fn->name + ">";
  }
  return "";
}
}  // namespace

bool truthy(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined:
    case Kind::None:
      return false;
    case Kind::Bool:
      return v.boolean;
    case Kind::Int:
      return v.integer != 0;
    case Kind::Float:
      return v.real != 0;
    case Kind::String:
      return !v.str->empty();
    case Kind::List:
      return !v.list->empty();
    case Kind::Dict:
      return !v.dict->items.empty();
    default:
      return true;
  }
}

namespace {
double as_double(const Value& v) {
  return v.kind == Kind::Float ? v.real : v.kind == Kind::Int ? static_cast<double>(v.integer) : v.boolean;
}
}  // namespace

namespace {
bool equals_at(const Value& a, const Value& b, int level);
}
bool equals(const Value& a, const Value& b) {
  return equals_at(a, b, 0);
}

namespace {
bool equals_at(const Value& a, const Value& b, int level) {
  if (level > static_cast<int>(kMaxValueDepth))
    fail("RecursionError", "maximum recursion depth exceeded in comparison");
  if (a.is_number() && b.is_number()) {
    if (a.kind == Kind::Float || b.kind == Kind::Float) return as_double(a) == as_double(b);
    const int64_t x = a.kind == Kind::Int ? a.integer : a.boolean;
    const int64_t y = b.kind == Kind::Int ? b.integer : b.boolean;
    return x == y;
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::Undefined:
    case Kind::None:
      return true;
    case Kind::String:
      return *a.str == *b.str;
    case Kind::List:
      if (a.tuple != b.tuple || a.list->size() != b.list->size()) return false;
      for (size_t i = 0; i < a.list->size(); ++i)
        if (!equals_at((*a.list)[i], (*b.list)[i], level + 1)) return false;
      return true;
    case Kind::Dict: {
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& [k, v] : a.dict->items) {
        const Value* other = b.dict->find(k);
        if (!other || !equals_at(v, *other, level + 1)) return false;
      }
      return true;
    }
    case Kind::Namespace:
      return a.ns == b.ns;
    case Kind::Callable:
      return a.fn == b.fn;
    default:
      return false;
  }
}

}  // namespace

std::string type_name(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined:
      return "Undefined";
    case Kind::None:
      return "NoneType";
    case Kind::Bool:
      return "bool";
    case Kind::Int:
      return "int";
    case Kind::Float:
      return "float";
    case Kind::String:
      return "str";
    case Kind::List:
      return v.tuple ? "tuple" : "list";
    case Kind::Dict:
      return "dict";
    case Kind::Namespace:
      return "Namespace";
    case Kind::Callable:
      return "function";
  }
  return "object";
}

std::string object_type_repr(const Value& v) {
  if (v.kind == Kind::None) return "None";
  if (v.kind == Kind::Namespace) return "jinja2.utils.Namespace object";
  return type_name(v) + " object";
}

namespace {
Value from_json_at(const nlohmann::ordered_json& j, uint32_t level);
}
Value from_json(const nlohmann::ordered_json& j) {
  return from_json_at(j, 0);
}

namespace {
Value from_json_at(const nlohmann::ordered_json& j, uint32_t level) {
  if (level >= kMaxValueDepth)
    fail("RecursionError", "JSON nests deeper than " + std::to_string(kMaxValueDepth) + " levels");
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value::none();
    case nlohmann::ordered_json::value_t::boolean:
      return Value::from_bool(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value::from_int(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const auto u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value::from_float(static_cast<double>(u));
      return Value::from_int(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Value::from_float(j.get<double>());
    case nlohmann::ordered_json::value_t::string: {
      std::string text = j.get<std::string>();
      if (const auto bad = pystr::find_invalid_utf8(text))
        fail("UnicodeDecodeError", "a context string is not valid UTF-8 (byte " + std::to_string(*bad) + ")");
      return Value::from_string(std::move(text));
    }
    case nlohmann::ordered_json::value_t::array: {
      List items;
      items.reserve(j.size());
      for (const auto& item : j) items.push_back(from_json_at(item, level + 1));
      return Value::from_list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict d;
      d.items.reserve(j.size());
      for (const auto& [k, v] : j.items()) {
        if (pystr::find_invalid_utf8(k))
          fail("UnicodeDecodeError", "a context object key is not valid UTF-8");
        d.items.emplace_back(k, from_json_at(v, level + 1));
      }
      return Value::from_dict(std::move(d));
    }
    default:
      fail("TypeError", "binary JSON values cannot be passed to a chat template");
  }
}
}  // namespace

namespace {

void dump_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out.push_back('"');
  for (char32_t cp : pystr::decode(s)) {
    char buf[16];
    switch (cp) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (cp < 0x20 || (ensure_ascii && cp >= 0x7F)) {
          if (cp >= 0x10000) {
            const char32_t v = cp - 0x10000;
            std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", static_cast<unsigned>(0xD800 | (v >> 10)),
                          static_cast<unsigned>(0xDC00 | (v & 0x3FF)));
          } else {
            std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(cp));
          }
          out += buf;
        } else {
          pystr::append_utf8(out, cp);
        }
    }
  }
  out.push_back('"');
}

void dump(std::string& out, const Value& v, const JsonDumpOptions& o, int depth) {
  if (depth > static_cast<int>(kMaxValueDepth))
    fail("RecursionError", "maximum recursion depth exceeded while encoding a JSON object");
  auto newline = [&](int level) {
    if (o.indent < 0) return;
    out.push_back('\n');
    out.append(static_cast<size_t>(o.indent * level), ' ');
  };
  switch (v.kind) {
    case Kind::None:
      out += "null";
      return;
    case Kind::Bool:
      out += v.boolean ? "true" : "false";
      return;
    case Kind::Int:
      out += std::to_string(v.integer);
      return;
    case Kind::Float:
      if (std::isnan(v.real)) {
        out += "NaN";
      } else if (std::isinf(v.real)) {
        out += v.real > 0 ? "Infinity" : "-Infinity";
      } else {
        out += float_repr(v.real);
      }
      return;
    case Kind::String:
      dump_string(out, *v.str, o.ensure_ascii);
      return;
    case Kind::List: {
      if (v.list->empty()) {
        out += "[]";
        return;
      }
      out += "[";
      for (size_t i = 0; i < v.list->size(); ++i) {
        if (i) out += o.item_separator;
        newline(depth + 1);
        dump(out, (*v.list)[i], o, depth + 1);
      }
      newline(depth);
      out += "]";
      return;
    }
    case Kind::Dict: {
      if (v.dict->items.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& item : v.dict->items) items.push_back(&item);
      if (o.sort_keys)
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out += "{";
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += o.item_separator;
        newline(depth + 1);
        dump_string(out, items[i]->first, o.ensure_ascii);
        out += o.key_separator;
        dump(out, items[i]->second, o, depth + 1);
      }
      newline(depth);
      out += "}";
      return;
    }
    default:
      fail("TypeError", "Object of type " + type_name(v) + " is not JSON serializable");
  }
}

}  // namespace

std::string json_dumps(const Value& v, const JsonDumpOptions& options) {
  std::string out;
  dump(out, v, options, 0);
  return out;
}

}  // namespace xmoe::jinja
