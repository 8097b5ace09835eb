// What jinja2's ImmutableSandboxedEnvironment offers a template, as transformers configures it: attribute and
// item lookup (with the sandbox's refusal of mutating methods), Python str/dict/list methods, filters, tests
// and the global functions.
#pragma once
#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "value.hpp"

namespace xmoe::jinja {

// environment.getattr: `obj.name`.
Value get_attribute(const Value& obj, const std::string& name);
// environment.getitem: `obj[key]`.
Value get_item(const Value& obj, const Value& key);
Value apply_filter(const std::string& name, const Value& target, CallArgs& args);
bool apply_test(const std::string& name, const Value& target, CallArgs& args);
// Globals: range, dict, namespace, raise_exception, strftime_now (formatting `now`, or local time when
// absent). Every namespace() made is recorded in `namespaces`: a template can make one contain itself, so the
// renderer empties them all when it finishes to break such reference cycles.
Dict make_globals(const std::optional<std::tm>& now, std::vector<std::shared_ptr<Dict>>& namespaces);

}  // namespace xmoe::jinja
