// Attribute and item lookup as jinja2's sandbox does it, and the Python str / dict / list methods templates
// call.
#include "builtins.hpp"

#include <algorithm>

#include "args.hpp"
#include "operators.hpp"
#include "pystr.hpp"

namespace xmoe::jinja {
namespace {

Value method(const std::string& name, std::function<Value(CallArgs&)> fn) {
  return Value::from_callable(name, std::move(fn));
}

Value unsafe(const Value& obj, const std::string& name) {
  return Value::undefined("access to attribute '" + name + "' of '" + type_name(obj) + "' object is unsafe.",
                          true);
}

Value missing_attribute(const Value& obj, const std::string& name) {
  // Built by append: GCC 12 warns falsely (-Wrestrict, bug 105329) on "'" + std::string.
  return Value::undefined(std::string(1, '\'')
                              .append(object_type_repr(obj))
                              .append("' has no attribute '")
                              .append(name)
                              .append("'"));
}

bool starts_or_ends(const std::string& s, const Value& affix, bool start) {
  auto one = [&](const Value& a) {
    if (a.kind != Kind::String)
      fail("TypeError", std::string(start ? "startswith" : "endswith") +
                            " first arg must be str or a tuple of str, not " + type_name(a));
    const std::string& x = a.s();
    if (x.size() > s.size()) return false;
    return start ? s.compare(0, x.size(), x) == 0 : s.compare(s.size() - x.size(), x.size(), x) == 0;
  };
  if (affix.kind == Kind::List) return std::any_of(affix.list->begin(), affix.list->end(), one);
  return one(affix);
}

Value string_method(const Value& obj, const std::string& name) {
  // The lambdas share the string, not copies of it: every attribute of a string (even a missing one) came
  // here, and copying a long string per lookup was most of the cost of loops that call its methods.
  const auto str = obj.str;
  if (name == "strip" || name == "lstrip" || name == "rstrip")
    return method(name, [str, name](CallArgs& a) {
      const std::string& s = *str;
      Args args(name, a, {"chars"});
      return Value::from_string(pystr::strip(s, args.opt_string(0), name != "rstrip", name != "lstrip"));
    });
  if (name == "split")
    return method(name, [str](CallArgs& a) {
      const std::string& s = *str;
      Args args("split", a, {"sep", "maxsplit"});
      List parts;
      for (auto& part : pystr::split(s, args.opt_string(0), static_cast<long>(args.integer(1, -1))))
        parts.push_back(Value::from_string(std::move(part)));
      return Value::from_list(std::move(parts));
    });
  if (name == "startswith" || name == "endswith")
    return method(name, [str, name](CallArgs& a) {
      const std::string& s = *str;
      Args args(name, a, {"prefix"});
      return Value::from_bool(starts_or_ends(s, args.get(0), name == "startswith"));
    });
  if (name == "replace")
    return method(name, [str](CallArgs& a) {
      const std::string& s = *str;
      Args args("replace", a, {"old", "new", "count"});
      return Value::from_string(
          pystr::replace(s, args.str(0), args.str(1), static_cast<long>(args.integer(2, -1))));
    });
  if (name == "upper" || name == "lower")
    return method(name, [str, name](CallArgs& a) {
      const std::string& s = *str;
      Args args(name, a, {});
      return Value::from_string(name == "upper" ? pystr::upper(s) : pystr::lower(s));
    });
  if (name == "find" || name == "count")
    return method(name, [str, name](CallArgs& a) {
      const std::string& s = *str;
      Args args(name, a, {"sub"});
      const std::string sub = args.str(0);
      if (name == "count") {
        if (sub.empty()) return Value::from_int(static_cast<int64_t>(pystr::length(s)) + 1);
        int64_t n = 0;
        for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size())) ++n;
        return Value::from_int(n);
      }
      const size_t at = s.find(sub);
      return Value::from_int(at == std::string::npos ? -1
                                                     : static_cast<int64_t>(pystr::length(s.substr(0, at))));
    });
  if (name == "join")
    return method(name, [str](CallArgs& a) {
      const std::string& s = *str;
      Args args("join", a, {"iterable"});
      std::string out;
      bool first = true;
      for (const Value& item : iterate(args.get(0))) {
        if (item.kind != Kind::String)
          fail("TypeError", "sequence item: expected str instance, " + type_name(item) + " found");
        if (!first) out += s;
        out += item.s();
        first = false;
      }
      return Value::from_string(std::move(out));
    });
  return missing_attribute(obj, name);
}

Value dict_method(const Value& obj, const std::string& name) {
  const auto dict = obj.dict;
  if (name == "items" || name == "keys" || name == "values")
    return method(name, [dict, name](CallArgs& a) {
      Args args(name, a, {});
      List out;
      for (const auto& [k, v] : dict->items) {
        if (name == "items")
          out.push_back(Value::from_tuple({Value::from_string(k), v}));
        else
          out.push_back(name == "keys" ? Value::from_string(k) : v);
      }
      return Value::from_list(std::move(out));
    });
  if (name == "get")
    return method(name, [dict](CallArgs& a) {
      Args args("get", a, {"key", "default"});
      const Value& key = args.get(0);
      const Value* found = key.kind == Kind::String ? dict->find(key.s()) : nullptr;
      return found ? *found : args.get_or(1, Value::none());
    });
  if (name == "copy")
    return method(name, [dict](CallArgs& a) {
      Args args("copy", a, {});
      return Value::from_dict(*dict);
    });
  return Value();  // not a method: the caller looks the key up
}

Value list_method(const Value& obj, const std::string& name) {
  const auto list = obj.list;
  if (name == "index" || name == "count")
    return method(name, [list, name](CallArgs& a) {
      Args args(name, a, {"value"});
      int64_t n = 0;
      for (size_t i = 0; i < list->size(); ++i)
        if (equals((*list)[i], args.get(0))) {
          if (name == "index") return Value::from_int(static_cast<int64_t>(i));
          ++n;
        }
      if (name == "index") fail("ValueError", to_repr(args.get(0)) + " is not in list");
      return Value::from_int(n);
    });
  return missing_attribute(obj, name);
}

bool is_mutating(Kind kind, const std::string& name) {
  static const char* const list_ops[] = {"append", "clear",  "extend",  "insert",
                                         "pop",    "remove", "reverse", "sort"};
  static const char* const dict_ops[] = {"clear", "pop", "popitem", "setdefault", "update"};
  if (kind == Kind::List)
    return std::find(std::begin(list_ops), std::end(list_ops), name) != std::end(list_ops);
  if (kind == Kind::Dict)
    return std::find(std::begin(dict_ops), std::end(dict_ops), name) != std::end(dict_ops);
  return false;
}

}  // namespace

Value get_attribute(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) obj.raise_undefined();
  // Every Python object has dunder attributes; the sandbox refuses them all.
  if (name.size() > 1 && name[0] == '_' && name[1] == '_' && obj.kind != Kind::Dict &&
      obj.kind != Kind::Namespace)
    return unsafe(obj, name);
  if (is_mutating(obj.kind, name)) return unsafe(obj, name);
  switch (obj.kind) {
    case Kind::String:
      return string_method(obj, name);
    case Kind::List:
      return list_method(obj, name);
    case Kind::Dict: {
      Value m = dict_method(obj, name);
      if (!m.is_undefined()) return m;
      if (const Value* v = obj.dict->find(name)) return *v;
      return missing_attribute(obj, name);
    }
    case Kind::Namespace:
      if (const Value* v = obj.ns->find(name)) return *v;
      return missing_attribute(obj, name);
    default:
      return missing_attribute(obj, name);
  }
}

Value get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) obj.raise_undefined();
  if (obj.kind == Kind::Dict && key.kind == Kind::String) {
    if (const Value* v = obj.dict->find(key.s())) return *v;
  } else if ((obj.kind == Kind::List || obj.kind == Kind::String) &&
             (key.kind == Kind::Int || key.kind == Kind::Bool)) {
    int64_t i = key.kind == Kind::Int ? key.integer : key.boolean;
    const std::u32string text = obj.kind == Kind::String ? pystr::decode(obj.s()) : std::u32string();
    const auto n = static_cast<int64_t>(obj.kind == Kind::String ? text.size() : obj.list->size());
    if (i < 0) i += n;
    if (i >= 0 && i < n) {
      if (obj.kind == Kind::List) return (*obj.list)[static_cast<size_t>(i)];
      std::string c;
      pystr::append_utf8(c, text[static_cast<size_t>(i)]);
      return Value::from_string(std::move(c));
    }
  }
  if (key.kind == Kind::String) {
    if (obj.kind == Kind::Dict) {
      Value m = dict_method(obj, key.s());
      if (!m.is_undefined()) return m;
      return is_mutating(Kind::Dict, key.s()) ? unsafe(obj, key.s()) : missing_attribute(obj, key.s());
    }
    return get_attribute(obj, key.s());
  }
  return Value::undefined(object_type_repr(obj) + " has no element " + to_repr(key));
}

}  // namespace xmoe::jinja
