#include "operators.hpp"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>

#include "pystr.hpp"

namespace xmoe::jinja {
namespace {

bool is_intlike(const Value& v) {
  return v.kind == Kind::Int || v.kind == Kind::Bool;
}
int64_t as_int(const Value& v) {
  return v.kind == Kind::Int ? v.integer : v.boolean;
}
double as_double(const Value& v) {
  return v.kind == Kind::Float ? v.real : static_cast<double>(as_int(v));
}

[[noreturn]] void unsupported(const std::string& op, const Value& a, const Value& b) {
  fail("TypeError",
       "unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" + type_name(b) + "'");
}

// Python integers are unbounded; this engine's are 64-bit, so leaving that range is an error, never
// wraparound.
[[noreturn]] void overflow() {
  fail("OverflowError", "integer result does not fit in 64 bits");
}
int64_t add(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) overflow();
  return r;
}
int64_t sub(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_sub_overflow(a, b, &r)) overflow();
  return r;
}
int64_t mul(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) overflow();
  return r;
}

int64_t floor_div(int64_t a, int64_t b) {
  if (a == INT64_MIN && b == -1) overflow();
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

Value repeat(const Value& seq, int64_t n) {
  const auto unit = static_cast<int64_t>(seq.kind == Kind::String ? seq.s().size() : seq.list->size());
  // Refused before allocating: a repeated string or list may not grow past the limits of any value.
  const auto limit = static_cast<int64_t>(seq.kind == Kind::String ? kMaxStringBytes : kMaxListItems);
  if (n > 0 && unit > 0 && n > limit / unit) fail("MemoryError", "repeated sequence would be too large");
  if (seq.kind == Kind::String) {
    // By doubling: a long repeat of a short string stays a few dozen copies, not millions of tiny appends.
    const size_t total = n > 0 ? static_cast<size_t>(unit * n) : 0;
    std::string out;
    out.reserve(total);
    if (total > 0) out = seq.s();
    while (out.size() < total) out.append(out, 0, std::min(out.size(), total - out.size()));
    return Value::from_string(std::move(out));
  }
  List out;
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq.list->begin(), seq.list->end());
  return seq.tuple ? Value::from_tuple(std::move(out)) : Value::from_list(std::move(out));
}

int three_way(const Value& a, const Value& b, const std::string& op) {
  if (a.is_undefined()) a.raise_undefined();
  if (b.is_undefined()) b.raise_undefined();
  if (a.is_number() && b.is_number()) {
    if (a.kind == Kind::Float || b.kind == Kind::Float) {
      const double x = as_double(a), y = as_double(b);
      return x < y ? -1 : x > y ? 1 : 0;
    }
    const int64_t x = as_int(a), y = as_int(b);
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.kind == Kind::String && b.kind == Kind::String) {
    const int c = a.s().compare(b.s());  // UTF-8 byte order is code point order
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.kind == Kind::List && b.kind == Kind::List) {
    const size_t n = std::min(a.list->size(), b.list->size());
    for (size_t i = 0; i < n; ++i)
      if (!equals((*a.list)[i], (*b.list)[i])) return three_way((*a.list)[i], (*b.list)[i], op);
    return a.list->size() < b.list->size() ? -1 : a.list->size() > b.list->size() ? 1 : 0;
  }
  fail("TypeError",
       "'" + op + "' not supported between instances of '" + type_name(a) + "' and '" + type_name(b) + "'");
}

}  // namespace

Value binary_op(const std::string& op, const Value& a, const Value& b) {
  if (op == "~") return Value::from_string(to_str(a) + to_str(b));
  if (a.is_undefined()) a.raise_undefined();
  if (b.is_undefined()) b.raise_undefined();
  const bool numbers = a.is_number() && b.is_number();
  const bool ints = is_intlike(a) && is_intlike(b);
  if (op == "+") {
    if (ints) return Value::from_int(add(as_int(a), as_int(b)));
    if (numbers) return Value::from_float(as_double(a) + as_double(b));
    if (a.kind == Kind::String && b.kind == Kind::String) {
      if (!a.safe && !b.safe) return Value::from_string(a.s() + b.s());
      // markupsafe.Markup escapes the plain operand of + (on either side) and stays Markup.
      Value joined = Value::from_string((a.safe ? a.s() : pystr::html_escape(a.s())) +
                                        (b.safe ? b.s() : pystr::html_escape(b.s())));
      joined.safe = true;
      return joined;
    }
    if (a.kind == Kind::List && b.kind == Kind::List && a.tuple == b.tuple) {
      List out = *a.list;
      out.insert(out.end(), b.list->begin(), b.list->end());
      return a.tuple ? Value::from_tuple(std::move(out)) : Value::from_list(std::move(out));
    }
    if (a.kind == Kind::String || a.kind == Kind::List)
      fail("TypeError",
           "can only concatenate " + type_name(a) + " (not \"" + type_name(b) + "\") to " + type_name(a));
    unsupported("+", a, b);
  }
  if (op == "-") {
    if (ints) return Value::from_int(sub(as_int(a), as_int(b)));
    if (numbers) return Value::from_float(as_double(a) - as_double(b));
    unsupported("-", a, b);
  }
  if (op == "*") {
    if (ints) return Value::from_int(mul(as_int(a), as_int(b)));
    if (numbers) return Value::from_float(as_double(a) * as_double(b));
    if ((a.kind == Kind::String || a.kind == Kind::List) && is_intlike(b)) return repeat(a, as_int(b));
    if ((b.kind == Kind::String || b.kind == Kind::List) && is_intlike(a)) return repeat(b, as_int(a));
    unsupported("*", a, b);
  }
  if (!numbers) unsupported(op == "**" ? "** or pow()" : op, a, b);
  if (op == "/") {
    if (as_double(b) == 0) fail("ZeroDivisionError", "division by zero");
    return Value::from_float(as_double(a) / as_double(b));
  }
  if (op == "//" || op == "%") {
    if (as_double(b) == 0)
      fail("ZeroDivisionError", op == "//" ? "integer division or modulo by zero" : "integer modulo by zero");
    if (ints) {
      const int64_t q = floor_div(as_int(a), as_int(b));
      return Value::from_int(op == "//" ? q : as_int(a) - q * as_int(b));  // |q * b| <= |a|
    }
    // CPython's float_divmod: the remainder from fmod, the quotient rounded from (a - mod) / b.
    const double x = as_double(a), y = as_double(b);
    double mod = std::fmod(x, y);
    double div = (x - mod) / y;
    if (mod != 0) {
      if ((y < 0) != (mod < 0)) {
        mod += y;
        div -= 1.0;
      }
    } else {
      mod = std::copysign(0.0, y);
    }
    double floordiv = std::copysign(0.0, x / y);
    if (div != 0) {
      floordiv = std::floor(div);
      if (div - floordiv > 0.5) floordiv += 1.0;
    }
    return Value::from_float(op == "//" ? floordiv : mod);
  }
  if (op == "**") {
    if (ints && as_int(b) >= 0) {
      int64_t result = 1;
      for (int64_t i = 0; i < as_int(b) && result != 0; ++i) result = mul(result, as_int(a));
      return Value::from_int(result);
    }
    return Value::from_float(std::pow(as_double(a), as_double(b)));
  }
  fail("TypeError", "unknown operator " + op);
}

Value negate(const Value& v, bool minus) {
  if (v.is_undefined()) v.raise_undefined();
  if (is_intlike(v)) return Value::from_int(minus ? sub(0, as_int(v)) : as_int(v));
  if (v.kind == Kind::Float) return Value::from_float(minus ? -v.real : v.real);
  fail("TypeError",
       std::string("bad operand type for unary ") + (minus ? "-" : "+") + ": '" + type_name(v) + "'");
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind) {
    case Kind::Undefined:
      return false;
    case Kind::String:
      if (item.kind != Kind::String)
        fail("TypeError", "'in <string>' requires string as left operand, not " + type_name(item));
      return container.s().find(item.s()) != std::string::npos;
    case Kind::List:
      for (const Value& v : *container.list)
        if (equals(v, item)) return true;
      return false;
    case Kind::Dict:
      if (item.kind == Kind::List || item.kind == Kind::Dict)
        fail("TypeError", "unhashable type: '" + type_name(item) + "'");
      return item.kind == Kind::String && container.dict->find(item.s()) != nullptr;
    default:
      fail("TypeError", "argument of type '" + type_name(container) + "' is not iterable");
  }
}

bool compare(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return equals(a, b);
  if (op == "!=") return !equals(a, b);
  if (op == "in") return contains(b, a);
  if (op == "notin") return !contains(b, a);
  const int c = three_way(a, b, op);
  if (op == "<") return c < 0;
  if (op == "<=") return c <= 0;
  if (op == ">") return c > 0;
  return c >= 0;
}

List iterate(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined:
      return {};
    case Kind::List:
      return *v.list;
    case Kind::Dict: {
      List keys;
      for (const auto& item : v.dict->items) keys.push_back(Value::from_string(item.first));
      return keys;
    }
    case Kind::String: {
      List chars;
      for (char32_t cp : pystr::decode(v.s())) {
        std::string c;
        pystr::append_utf8(c, cp);
        chars.push_back(Value::from_string(std::move(c)));
      }
      return chars;
    }
    default:
      fail("TypeError", "'" + type_name(v) + "' object is not iterable");
  }
}

Value slice(const Value& v, const std::optional<int64_t>& start, const std::optional<int64_t>& stop,
            const std::optional<int64_t>& step_opt) {
  if (v.is_undefined()) v.raise_undefined();
  // Slices bypass jinja2's getitem, so a non-sequence raises Python's TypeError.
  if (v.kind != Kind::List && v.kind != Kind::String)
    fail("TypeError", "'" + type_name(v) + "' object is not subscriptable");
  const int64_t step = step_opt.value_or(1);
  if (step == 0) fail("ValueError", "slice step cannot be zero");
  const std::u32string text = v.kind == Kind::String ? pystr::decode(v.s()) : std::u32string();
  const auto n = static_cast<int64_t>(v.kind == Kind::String ? text.size() : v.list->size());
  // PySlice_AdjustIndices
  auto adjust = [&](const std::optional<int64_t>& i, int64_t dflt) {
    if (!i) return dflt;
    int64_t x = *i;
    if (x < 0) {
      x += n;
      if (x < 0) x = step < 0 ? -1 : 0;
    } else if (x >= n) {
      x = step < 0 ? n - 1 : n;
    }
    return x;
  };
  const int64_t lo = adjust(start, step < 0 ? n - 1 : 0);
  const int64_t hi = adjust(stop, step < 0 ? -1 : n);
  std::vector<int64_t> picked;
  if (step > 0)
    for (int64_t i = lo; i < hi; i += step) picked.push_back(i);
  else
    for (int64_t i = lo; i > hi; i += step) picked.push_back(i);
  if (v.kind == Kind::String) {
    std::u32string out;
    for (int64_t i : picked) out.push_back(text[static_cast<size_t>(i)]);
    return Value::from_string(pystr::encode(out));
  }
  List out;
  for (int64_t i : picked) out.push_back((*v.list)[static_cast<size_t>(i)]);
  return Value::from_list(std::move(out));
}

int64_t length_of(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined:
      return 0;
    case Kind::String:
      return static_cast<int64_t>(pystr::length(v.s()));
    case Kind::List:
      return static_cast<int64_t>(v.list->size());
    case Kind::Dict:
      return static_cast<int64_t>(v.dict->items.size());
    default:
      fail("TypeError", "object of type '" + type_name(v) + "' has no len()");
  }
}

}  // namespace xmoe::jinja
