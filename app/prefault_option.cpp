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

}  // namespace xmoe::app
