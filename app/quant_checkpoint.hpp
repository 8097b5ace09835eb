// Quantized linears in the exact tensor layouts and configs the published checkpoints use, for the
// checkpoint writers (`init-model --quant`, `quantize`):
//  * fp8-block (DeepSeek / Qwen3-FP8, transformers' FineGrainedFP8): `weight` F8_E4M3 [N, K] +
//    `weight_scale_inv` F32 [⌈N/128⌉, ⌈K/128⌉]; config.json quantization_config quant_method "fp8" (the
//    ue8m0 layout: scales rounded up to powers of two and `scale_fmt: ue8m0`, as DeepSeek-V3.1);
//  * mxfp4 (compressed-tensors `mxfp4-pack-quantized`, as vLLM's CompressedTensorsW4A16Mxfp4 reads it;
//  gpt-oss's
//    `*_blocks`/`*_scales` naming belongs to its fused GptOss experts, not to a Qwen3-MoE's per-expert
//    linears): `weight_packed` U8 [N, K/2] + `weight_scale` U8 (E8M0) [N, K/32]; quant_method
//    "compressed-tensors";
//  * nvfp4 (NVIDIA ModelOpt): `weight` U8 [N, K/2] + `weight_scale` F8_E4M3 [N, K/16] + `weight_scale_2` F32
//  []
//    + `input_scale` F32 []; hf_quant_config.json and quantization_config quant_method "modelopt";
//  * nvfp4 in the compressed-tensors layout (Red Hat's NVFP4 releases, `nvfp4-pack-quantized`, W4A4):
//    `weight_packed` U8 [N, K/2] + `weight_scale` F8_E4M3 [N, K/16] + `weight_global_scale` F32 [1] (the
//    inverse of ModelOpt's weight_scale_2) + `input_global_scale` F32 [1]; quant_method "compressed-tensors".
// Which tensors are quantized is the architecture's tensor plan's (llm/arch/tensor_plan.hpp): its
// quantized_linear tensors, as the published checkpoints choose them (for Qwen3-MoE attention q/k/v/o and
// MLP / expert gate/up/down projections; embeddings, norms, biases, the router and lm_head stay as they are).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "safetensors_stream_writer.hpp"

namespace xmoe::app {

// fp8_block_ue8m0: the same tensors with block scales rounded up to powers of two and `scale_fmt: ue8m0` in
// the config, as DeepSeek-V3.1 publishes them.
enum class QuantTarget { fp8_block, fp8_block_ue8m0, mxfp4, nvfp4, nvfp4_compressed };

// flag: "fp8-block" | "mxfp4" | "nvfp4"; layout: "" (the format's default: f32 scales for fp8-block, ModelOpt
// for nvfp4, compressed-tensors for mxfp4) | "ue8m0" | "modelopt" | "compressed-tensors"; throws naming a
// layout the format is not written in.
QuantTarget parse_quant_target(const std::string& flag, const std::string& layout = "");
const char* quant_target_flag(QuantTarget t);  // the --quant / --to value
inline bool is_nvfp4(QuantTarget t) {
  return t == QuantTarget::nvfp4 || t == QuantTarget::nvfp4_compressed;
}
inline const std::vector<std::string> kQuantTargetFlags = {"fp8-block", "mxfp4", "nvfp4"};
inline const std::vector<std::string> kQuantLayoutFlags = {"modelopt", "compressed-tensors", "ue8m0"};
inline constexpr const char* kQuantLayoutHelp =
    "tensor naming of --quant nvfp4: modelopt (weight, weight_scale_2; default) | compressed-tensors "
    "(weight_packed, weight_global_scale, as Red Hat publishes it); of fp8-block: ue8m0 (block scales "
    "rounded up "
    "to powers of two, scale_fmt ue8m0, as DeepSeek-V3.1 publishes them; default: f32 scales); mxfp4 is "
    "written as compressed-tensors";

// The tensors written in place of `name` (a `.weight` of [rows, cols]); throws naming the tensor when cols
// does not fit the format's block (MXFP4: multiple of 32, NVFP4: of 16).
std::vector<StreamedTensor> quantized_tensor_specs(QuantTarget t, const std::string& name, int64_t rows,
                                                   int64_t cols);
// Their bytes, in the same order. nvfp4_weight_scale_2: the pair's shared global scale (NVFP4 only).
std::vector<std::vector<uint8_t>> quantized_tensor_bytes(QuantTarget t, const float* w, int64_t rows,
                                                         int64_t cols, float nvfp4_weight_scale_2);

// gpt-oss's fused experts [E, in, out] (x @ W) as published in MXFP4: `<name>_blocks` U8 [E, out, in/32, 16]
// + `<name>_scales` U8 [E, out, in/32] (each expert transposed to its [out, in] linear). Throws naming the
// tensor unless the target is MXFP4 and `in` a multiple of 32 (gpt-oss publishes its experts in MXFP4 only).
std::vector<StreamedTensor> mxfp4_fused_expert_specs(QuantTarget t, const std::string& name, int64_t experts,
                                                     int64_t in, int64_t out);
// Appends one expert's [in, out] weights quantized: the blocks to bytes[0], the scales to bytes[1].
void append_mxfp4_fused_expert(const float* w, int64_t in, int64_t out,
                               std::vector<std::vector<uint8_t>>& bytes);
// gpt-oss's own `quantization_config` (transformers' Mxfp4HfQuantizer: quant_method "mxfp4").
void write_mxfp4_experts_config(nlohmann::ordered_json& config, const std::vector<std::string>& kept_modules);

// Adds config.json's `quantization_config` (and for NVFP4 writes `hf_quant_config.json` into dir), naming as
// not converted the linear modules the writer left unquantized (the plan's kept_linear ones, top-level
// modules such as lm_head first).
void write_quantization_config(QuantTarget t, nlohmann::ordered_json& config,
                               std::vector<std::string> kept_modules, const std::string& dir);

}  // namespace xmoe::app
