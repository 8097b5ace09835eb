// The arithmetic of the `medium` matmul precision for FP8 block weights at the AMX level, which the AMX
// kernel and its scalar reference share: linear_quant_bf16dot.hpp's FP8 operands, summed as TDPBF16PS sums
// (linear_bf16tile.hpp). The operands: each code as bf16(E4M3 value · 2^-8) (exact); each activation scaled
// by its weight block's multiplier · 2^8 and rounded to bf16 as VCVTNE2PS2BF16 rounds (an f32 subnormal
// product reads as zero); both in FP8 chunk order (k padded to a multiple of 64 with zeros; of each chunk of
// 64 elements, its 32 even elements and then its 32 odd ones). Those padded / 32 steps of 32 are summed in
// TDPBF16PS's order: per step an even-pair sum and an odd-pair sum from +0, then the step's value into the
// output. So the two levels take the same bf16 operands and differ only in the summation order; every output
// depends only on its own row of x and of W, never on m, the column block or the threads.
#pragma once

#include <cstdint>

#include "kernels/packed_weight.hpp"

namespace xmoe::kernels {

namespace reference {
void linear_fp8_block_medium_tile(const LinearArgs& args);
}  // namespace reference
namespace amx {
inline constexpr int64_t kFp8TileDecodeRows = 16;  // up to this many x rows the weights are the A operand
void linear_fp8_block_medium(const LinearArgs& args);
}  // namespace amx

}  // namespace xmoe::kernels
