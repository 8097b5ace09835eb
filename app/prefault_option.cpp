#include "prefault_option.hpp"

namespace xmoe::app {

CLI::Option* add_prefault_option(CLI::App* cmd, std::string& value) {
  return cmd
      ->add_option("--prefault", value,
                   "map the weights into the page tables at load: auto (when the checkpoint fits in 90 % of "
                   "the available memory) | on | off (each page on first read)")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
}

CLI::Option* add_page_cache_option(CLI::App* cmd, std::string& value) {
  return cmd
      ->add_option("--page-cache", value,
                   "with a prefault, checkpoint files cached in pages smaller than 2 MiB (just written or "
                   "downloaded; mapped 4 KiB at a time, they stream up to 1.5x slower): auto (drop them from "
                   "the page cache and read them again into 2 MiB pages when fewer than half of their bytes "
                   "are mapped so) | keep | reload (always)")
      ->check(CLI::IsMember({"auto", "keep", "reload"}))
      ->capture_default_str();
}

}  // namespace xmoe::app
