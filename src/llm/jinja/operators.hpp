// Python semantics of the operators templates use: arithmetic, concatenation, comparison, `in`, iteration,
// subscripts and slices, with Python's error messages.
#pragma once
#include <optional>
#include <string>

#include "value.hpp"

namespace xmoe::jinja {

Value binary_op(const std::string& op, const Value& a, const Value& b);  // + - * / // % ** ~
Value negate(const Value& v, bool minus);
bool compare(const std::string& op, const Value& a, const Value& b);  // == != < <= > >= in notin
bool contains(const Value& container, const Value& item);
// for-loop iteration: list items, dict keys, string characters; Undefined iterates as empty.
List iterate(const Value& v);
Value slice(const Value& v, const std::optional<int64_t>& start, const std::optional<int64_t>& stop,
            const std::optional<int64_t>& step);
// len(): code points of a string, items of a list or dict.
int64_t length_of(const Value& v);

}  // namespace xmoe::jinja
