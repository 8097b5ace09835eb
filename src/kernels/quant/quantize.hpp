// f32 matrices → the tensors the published quantized checkpoints hold, with scales computed as the reference
// quantizers compute them (each function names its reference). One implementation for the checkpoint writers
// (init-model --quant, quantize) and the tests.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/packed_weight.hpp"

namespace xmoe::kernels::quant {

// One quantized [rows, cols] matrix: `data` is the element tensor (E4M3 bytes [rows, cols], or E2M1 pairs
// [rows, cols / 2] with the even column in the low nibble), `scales` the scale tensor's raw little-endian
// bytes with shape `scale_shape`, `global_scale` NVFP4's weight_scale_2.
struct QuantizedMatrix {
  WeightFormat format = WeightFormat::fp8_block;
  int64_t rows = 0, cols = 0;
  std::vector<uint8_t> data;
  ScaleType scale_type = ScaleType::none;
  std::vector<uint8_t> scales;
  std::vector<int64_t> scale_shape;
  int block_rows = 1, block_cols = 1;
  float global_scale = 1.0f;

  // A view of these bytes (valid while this object lives and is not moved).
  PackedWeight view() const;
};

// DeepSeek / transformers FP8 block: 128 × 128 blocks (edge blocks smaller), per block amax, the forward
// scale 448 / amax computed as (1 / amax) · 448 (1 for an all-zero block), `weight_scale_inv` = 1 / scale as
// f32 [⌈rows/128⌉, ⌈cols/128⌉] and the elements E4M3(clamp(w · scale, ±448)), as transformers' Fp8Quantize
// computes them (it refuses partial blocks; here they take the same formula over their smaller extent,
// matching DeepSeek's dequantisation rule). ue8m0 (DeepSeek-V3.1's `scale_fmt`): weight_scale_inv rounded UP
// to a power of two (2^⌈log2⌉ from its bits, as DeepSeek's fast_round_scale and transformers' ue8m0 branch
// do) and the forward scale its exact reciprocal; still stored as f32.
QuantizedMatrix quantize_fp8_block(const float* w, int64_t rows, int64_t cols, bool ue8m0 = false,
                                   int block = 128);

// OCP MXFP4 as gpt-oss's checkpoints were made (triton_kernels downcast_to_mxfp, scale rounding ROUND_UP,
// RTNE elements): per 32 columns amax, dequant scale amax / 6 rounded up to a power of two by its bits, E8M0
// code = that exponent, elements E2M1(w · (1 / scale)) (0 for an all-zero block). cols must be a multiple
// of 32. Scales [rows, cols / 32]; gpt-oss's `*_blocks` is `data` viewed as [rows, cols / 32, 16].
QuantizedMatrix quantize_mxfp4(const float* w, int64_t rows, int64_t cols);

// NVIDIA ModelOpt NVFP4 (NVFP4QTensor): weight_scale_2 = amax(w) / (6 · 448) (pass it to share one between
// gate and up); per 16 columns weight_scale = E4M3(amax_block / (6 · weight_scale_2)) (1 where that is 0);
// elements E2M1(w / (weight_scale · weight_scale_2)), RNE, −0 → +0 (ModelOpt takes the sign from w < 0).
// cols must be a multiple of 16. Scales [rows, cols / 16].
float nvfp4_weight_scale_2(const float* w, int64_t n);
QuantizedMatrix quantize_nvfp4(const float* w, int64_t rows, int64_t cols, float weight_scale_2);
QuantizedMatrix quantize_nvfp4(const float* w, int64_t rows, int64_t cols);

}  // namespace xmoe::kernels::quant
