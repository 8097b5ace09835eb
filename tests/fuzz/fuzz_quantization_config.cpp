// Quantization configs of arbitrary bytes: config.json's quantization_config (first byte even) or ModelOpt's
// hf_quant_config.json next to a stub config.json (first byte odd); then the module filters are applied.
#include <cstdint>

#include "fuzz_support.hpp"
#include "llm/quantization.hpp"
#include "xmoe/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const xmoe::fuzz::ScratchDir dir;
  if (size == 0) return 0;
  const auto text = xmoe::fuzz::as_text(data + 1, size - 1);
  if (data[0] % 2 == 0) {
    dir.write("config.json", text);
    dir.remove("hf_quant_config.json");
  } else {
    dir.write("config.json", R"({"quantization_config": {"quant_method": "modelopt"}})");
    dir.write("hf_quant_config.json", text);
  }
  try {
    const auto q = xmoe::llm::parse_quantization_config(dir.path());
    int kept = 0;
    for (const char* module : {"lm_head", "model.layers.0.mlp.experts.0.gate_proj", "model.layers.1.mlp.gate",
                               "model.layers.10.self_attn.q_proj"})
      kept += q.is_not_converted(module);
    volatile int sink = kept;
    (void)sink;
  } catch (const xmoe::Error&) {
  }
  return 0;
}
