// config.json of arbitrary bytes → the typed model config, through the public parse entry point (so this
// target follows the parser wherever the per-architecture configs go).
#include <algorithm>
#include <cstdint>
#include <string>

#include "fuzz_support.hpp"
#include "llm/model_config.hpp"
#include "xmoe/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto config =
        xmoe::llm::parse_model_config_text(std::string(xmoe::fuzz::as_text(data, size)), "config.json");
    int sparse = 0;
    for (int i = 0; i < std::min(config.num_hidden_layers, 256); ++i) sparse += config.is_sparse_layer(i);
    volatile int sink = sparse;
    (void)sink;
  } catch (const xmoe::Error&) {
  }
  return 0;
}
