// Binds call arguments to Python-style parameter lists for the engine's built-in functions, filters and
// methods.
#pragma once
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "value.hpp"

namespace xmoe::jinja {

// Binds positional and keyword arguments to a Python-style parameter list.
class Args {
 public:
  Args(const std::string& fn, CallArgs& args, std::initializer_list<const char*> params)
      : fn_(fn), params_(params), bound_(params.size()) {
    if (args.positional.size() > params_.size())
      fail("TypeError", fn + "() takes at most " + std::to_string(params_.size()) + " argument(s) (" +
                            std::to_string(args.positional.size()) + " given)");
    for (size_t i = 0; i < args.positional.size(); ++i) bound_[i] = args.positional[i];
    for (auto& [key, value] : args.keyword) {
      // Compared through a named reference: clang 14 cannot capture a structured binding in a lambda.
      const std::string& name = key;
      const auto it = std::find_if(params_.begin(), params_.end(), [&](const char* p) { return name == p; });
      if (it == params_.end()) fail("TypeError", fn + "() got an unexpected keyword argument '" + key + "'");
      auto& slot = bound_[static_cast<size_t>(it - params_.begin())];
      if (slot) fail("TypeError", fn + "() got multiple values for argument '" + key + "'");
      slot = value;
    }
  }
  bool has(size_t i) const { return bound_[i].has_value(); }
  const Value& get(size_t i) const {
    if (!bound_[i]) fail("TypeError", fn_ + "() missing required argument: '" + params_[i] + "'");
    return *bound_[i];
  }
  Value get_or(size_t i, Value fallback) const { return bound_[i] ? *bound_[i] : std::move(fallback); }
  std::optional<std::string> opt_string(size_t i) const {
    if (!bound_[i] || bound_[i]->kind == Kind::None) return std::nullopt;
    return str(i);
  }
  std::string str(size_t i) const {
    const Value& v = get(i);
    if (v.kind != Kind::String)
      fail("TypeError", fn_ + "() argument '" + params_[i] + "' must be str, not " + type_name(v));
    return v.s();
  }
  int64_t integer(size_t i, int64_t fallback) const {
    if (!bound_[i]) return fallback;
    const Value& v = *bound_[i];
    if (v.kind == Kind::Int) return v.integer;
    if (v.kind == Kind::Bool) return v.boolean;
    fail("TypeError", fn_ + "() argument '" + params_[i] + "' must be an integer, not " + type_name(v));
  }

 private:
  std::string fn_;
  std::vector<const char*> params_;
  std::vector<std::optional<Value>> bound_;
};

}  // namespace xmoe::jinja
