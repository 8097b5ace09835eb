// Recursive-descent parser following jinja2's grammar and operator precedence for the supported subset.
#pragma once
#include <memory>
#include <string>

#include "ast.hpp"

namespace xmoe::jinja {

// Throws xmoe::Error naming `name`, the line, the column and the construct on unsupported or invalid syntax.
std::unique_ptr<Program> parse_program(const std::string& source, const std::string& name);

}  // namespace xmoe::jinja
