// How a checkpoint says its weights are quantized: config.json's quantization_config (quant_method "fp8":
// DeepSeek FP8 block; "mxfp4": gpt-oss's *_blocks / *_scales; "compressed-tensors": NVFP4 or MXFP4
// pack-quantized) or ModelOpt's hf_quant_config.json (quant_algo NVFP4). Which tensors are quantized is read
// from each tensor's dtype in the safetensors header, never assumed from the config: the config names the
// scheme, its block size and the modules left unconverted.
#pragma once
#include <string>
#include <vector>

namespace xmoe::llm {

enum class QuantScheme {
  none,
  fp8_block,         // weight F8_E4M3 [N, K] + weight_scale_inv F32 [⌈N/128⌉, ⌈K/128⌉]
  mxfp4,             // gpt-oss: <name>_blocks U8 [..., N, K/32, 16] + <name>_scales U8 (E8M0) [..., N, K/32]
  nvfp4_modelopt,    // weight U8 [N, K/2] + weight_scale F8_E4M3 [N, K/16] + weight_scale_2 F32 scalar
  nvfp4_compressed,  // weight_packed U8 [N, K/2] + weight_scale F8_E4M3 [N, K/16] + weight_global_scale
                     // F32 (stored inverted: the multiplier is its reciprocal)
  mxfp4_compressed,  // weight_packed U8 [N, K/2] + weight_scale U8 (E8M0) [N, K/32]
};
const char* quant_scheme_name(QuantScheme s);

struct QuantizationConfig {
  QuantScheme scheme = QuantScheme::none;
  std::string source;  // the file and field it came from, for messages
  // Module names (or "*" globs, or "re:" regular expressions) kept unquantized: modules_to_not_convert,
  // exclude_modules or compressed-tensors' ignore.
  std::vector<std::string> not_converted;
  bool ue8m0_scales = false;  // fp8 scale_fmt "ue8m0": block scales are powers of two

  // Whether the module (a weight's name without ".weight") is listed as kept unquantized.
  bool is_not_converted(const std::string& module) const;
};

// Reads the quantization scheme of checkpoint `dir` (config.json and hf_quant_config.json). Throws naming
// the file and field for an unknown quant_method / quant_algo / format, or a block size other than the
// scheme's.
QuantizationConfig parse_quantization_config(const std::string& dir);

}  // namespace xmoe::llm
