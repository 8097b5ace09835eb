// The arithmetic of the `medium` matmul precision (linear_precision.hpp) for block-quantized weights (FP8
// block, MXFP4, NVFP4), which the AVX512-BF16 kernels and their scalar reference share. It is BF16 medium's
// arithmetic (linear_bf16dot.hpp) with the block scale applied to f32 partial sums:
//  * each activation is rounded to bf16 (nearest even, bf16::from_float);
//  * each weight code becomes a bf16 exactly: an E2M1 value as it is; an E4M3 value times 2^-8 (normal in
//    bf16 for every code, subnormals included, so VDPBF16PS's denormals-are-zero never drops one); the block
//    multiplier q (quant::block_multiplier: E8M0 / E4M3 / f32 scale, times NVFP4's global scale) becomes
//    q · 2^8 for FP8 (one f32 product), q for FP4;
//  * k is cut into chunks of C = 128 (FP4) or 64 (FP8) elements, each S = C / 32 VDPBF16PS steps. In chunk c
//    (elements c..c+C-1), step s and lane l (0..15) take the pair of elements e0 = c + (C/16)·l + s and
//    e1 = e0 + C/32, and add, as VDPBF16PS does, first the e1 product and then the e0 product, each added
//    exactly and rounded once to f32 (nearest even; bf16 denormal operands as zero, denormal sums flushed).
//    Lane l's partial sum P starts at +0 in every chunk and runs over the S steps; all its 2S elements lie in
//    one scale block (block widths are multiples of 16), whose multiplier m gives the lane's accumulator
//    acc_l = fma(P, m, acc_l). Elements at or past k are zeros; a lane all of whose elements are past k
//    leaves acc_l alone;
//  * the 16 lanes are added in linear_lanes.hpp's fixed tree.
// This pairing is what the kernels get from in-register unpacking without any interleave: 64 FP4 bytes read
// as 32 words give the nibbles s = 0..3 of every word by shifts of 4·s; 64 FP8 bytes give the low and the
// high byte of every word. Activations are put in the same order once per call. Every output depends only on
// its own row of x and of W, never on m, the column block or the thread count.
#pragma once
#include <cstdint>

#include "kernels/packed_weight.hpp"

namespace xmoe::kernels {

inline constexpr int64_t quant_bf16dot_chunk(WeightFormat f) {
  return f == WeightFormat::fp8_block ? 64 : 128;
}

namespace reference {
void linear_fp8_block_medium(const LinearArgs& args);
void linear_mxfp4_medium(const LinearArgs& args);
void linear_nvfp4_medium(const LinearArgs& args);
}  // namespace reference
namespace avx512_bf16 {
void linear_fp8_block_medium(const LinearArgs& args);
void linear_mxfp4_medium(const LinearArgs& args);
void linear_nvfp4_medium(const LinearArgs& args);
}  // namespace avx512_bf16

}  // namespace xmoe::kernels
