// --prefault and --page-cache for the commands that run a model (generate, serve): whether the mapped
// weights enter the page tables at load, and whether files cached in small pages are read again into 2 MiB
// ones (src/llm/prefault.hpp).
#pragma once
#include <CLI/CLI.hpp>
#include <string>

namespace xmoe::app {

CLI::Option* add_prefault_option(CLI::App* cmd, std::string& value);
CLI::Option* add_page_cache_option(CLI::App* cmd, std::string& value);

}  // namespace xmoe::app
