// --prefault for the commands that run a model (generate, serve): whether the mapped weights enter the page
// tables at load (src/llm/prefault.hpp).
#pragma once
#include <CLI/CLI.hpp>
#include <string>

namespace xmoe::app {

CLI::Option* add_prefault_option(CLI::App* cmd, std::string& value);

}  // namespace xmoe::app
