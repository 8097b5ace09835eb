// Executes a parsed template: jinja2's scoping (for bodies and macros get their own scope, if does not),
// loop variables, macros, namespaces and loop controls.
#pragma once
#include <ctime>
#include <optional>
#include <string>

#include "ast.hpp"

namespace xmoe::jinja {

// Renders `program` with the variables in `context` (a Dict value); throws xmoe::Error naming the template
// and the line on failure.
std::string render_program(const Program& program, const Value& context, const std::optional<std::tm>& now);

}  // namespace xmoe::jinja
