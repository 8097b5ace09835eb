// The global functions a chat template can call: jinja2's range / dict / namespace and transformers'
// raise_exception / strftime_now.
#include <chrono>

#include "args.hpp"
#include "builtins.hpp"
#include "pystr.hpp"

namespace xmoe::jinja {

Dict make_globals(const std::optional<std::tm>& now, std::vector<std::shared_ptr<Dict>>& namespaces) {
  Dict g;
  g.set("raise_exception", Value::from_callable("raise_exception", [](CallArgs& a) -> Value {
          Args args("raise_exception", a, {"message"});
          fail("TemplateError", to_str(args.get(0)));
        }));
  g.set("strftime_now", Value::from_callable("strftime_now", [now](CallArgs& a) {
          Args args("strftime_now", a, {"format"});
          const std::string format = args.str(0);
          std::tm tm{};
          if (now) {
            tm = *now;
          } else {
            const std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
            localtime_r(&t, &tm);
          }
          if (format.empty()) return Value::from_string("");
          std::string buf(256 + format.size() * 8, '\0');
          const size_t n = std::strftime(buf.data(), buf.size(), format.c_str(), &tm);
          buf.resize(n);
          return Value::from_string(std::move(buf));
        }));
  g.set("range", Value::from_callable("range", [](CallArgs& a) {
          if (!a.keyword.empty()) fail("TypeError", "range() takes no keyword arguments");
          std::vector<int64_t> n;
          for (const Value& v : a.positional) {
            if (v.kind != Kind::Int && v.kind != Kind::Bool)
              // Built by append: GCC 12 warns falsely (-Wrestrict, bug 105329) on "'" + std::string.
              fail("TypeError", std::string(1, '\'')
                                    .append(type_name(v))
                                    .append("' object cannot be interpreted as an integer"));
            n.push_back(v.kind == Kind::Int ? v.integer : v.boolean);
          }
          if (n.empty() || n.size() > 3) fail("TypeError", "range expected 1 to 3 arguments");
          const int64_t start = n.size() == 1 ? 0 : n[0], stop = n.size() == 1 ? n[0] : n[1];
          const int64_t step = n.size() == 3 ? n[2] : 1;
          if (step == 0) fail("ValueError", "range() arg 3 must not be zero");
          List out;
          for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
            // The sandbox's MAX_RANGE.
            if (out.size() >= 100000)
              fail("OverflowError",
                   "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
            out.push_back(Value::from_int(i));
            if (__builtin_add_overflow(i, step, &i)) break;
          }
          return Value::from_list(std::move(out));
        }));
  auto build_dict = [](const std::string& fn, CallArgs& a, bool check_names) {
    Dict d;
    if (a.positional.size() > 1) fail("TypeError", fn + " expected at most 1 positional argument");
    if (!a.positional.empty()) {
      const Value& init = a.positional[0];
      if (init.kind != Kind::Dict) fail("TypeError", fn + ": positional argument must be a mapping");
      d = *init.dict;
    }
    for (auto& [k, v] : a.keyword) d.set(k, v);
    if (check_names)
      for (const auto& [k, v] : d.items)
        if (!k.empty() && k[0] == '_')
          fail("SecurityError",
               "Chat templates cannot store underscore-prefixed attributes on a namespace, but got " +
                   pystr::repr(k) + ". Please rename the attribute.");
    return d;
  };
  g.set("namespace", Value::from_callable("namespace", [build_dict, &namespaces](CallArgs& a) {
          Value ns = Value::new_namespace(build_dict("namespace", a, true));
          namespaces.push_back(ns.ns);
          return ns;
        }));
  g.set("dict", Value::from_callable("dict", [build_dict](CallArgs& a) {
          return Value::from_dict(build_dict("dict", a, false));
        }));
  return g;
}

}  // namespace xmoe::jinja
