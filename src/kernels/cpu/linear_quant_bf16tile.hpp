// The arithmetic of the `medium` matmul precision for block-quantized weights at the AMX level, which the
// AMX kernels and their scalar references share: bf16 operands in a chunk order, summed as TDPBF16PS sums
// (linear_bf16tile.hpp: per step of 32 an even-pair sum and an odd-pair sum from +0, then the step's value
// into the output; DAZ/FTZ). Zeros past k on both sides. Every output depends only on its own row of x and of
// W, never on m, the column block or the threads.
//  * FP8 block: linear_quant_bf16dot.hpp's FP8 operands — each code as bf16(E4M3 value · 2^-8) (exact); each
//    activation scaled by its weight block's multiplier · 2^8 and rounded to bf16 as VCVTNE2PS2BF16 rounds
//    (an f32 subnormal product reads as zero) — in FP8 chunk order (k padded to a multiple of 64; of each
//    chunk of 64 elements, its 32 even elements and then its 32 odd ones), over padded / 32 steps.
//  * MXFP4: linear_quant_bf16dot.hpp's MXFP4 operands — each weight bf16(E2M1 value · 2^(code - 127)),
//    exact for scale codes 2..252; each activation rounded to bf16 — in FP4 chunk order (k padded to a
//    multiple of 128; in each chunk, step s's word 2l + h holds element 8·l + 4·h + s).
// So the VDPBF16PS and TDPBF16PS kernels take the same operands and differ in the summation order. NVFP4 has
// no tile kernel (linear_mxfp4_bf16tile_amx.cpp says why): the AMX level keeps VDPBF16PS's for it.
#pragma once

#include <cstdint>

#include "kernels/packed_weight.hpp"

namespace xmoe::kernels {

namespace reference {
void linear_fp8_block_medium_tile(const LinearArgs& args);
void linear_mxfp4_medium_tile(const LinearArgs& args);
}  // namespace reference
namespace amx {
inline constexpr int64_t kFp8TileDecodeRows = 16;  // up to this many x rows the weights are the A operand
void linear_fp8_block_medium(const LinearArgs& args);
inline constexpr int64_t kMxfp4TileDecodeRows = 16;  // likewise for MXFP4
void linear_mxfp4_medium(const LinearArgs& args);
}  // namespace amx

}  // namespace xmoe::kernels
