// The arithmetic of the `medium` matmul precision (linear_precision.hpp) for BF16 weights at the AMX level,
// which the AMX kernel and its scalar reference share. It is TDPBF16PS's, as the instruction computes it
// (checked against the instruction on random and hand-made tiles, tests/llm/test_linear_bf16tile.cpp):
//  * each activation is rounded to bf16 (nearest even, bf16::from_float);
//  * k is cut into steps of 32 (16 pairs). In a step, the 16 even products x[2l]·w[2l] are added in l order
//    to an f32 sum that starts at +0, and the 16 odd products x[2l+1]·w[2l+1] to a second one; each addition
//    is exact then rounded once (nearest even). The step's value, even + odd rounded once, is added to the
//    output's running sum (from +0), rounded once. bf16 denormal operands count as zero and every denormal
//    result is flushed to a signed zero (fixed DAZ/FTZ, independent of MXCSR). Past k, operands are zeros.
// So, as with VDPBF16PS's arithmetic (linear_bf16dot.hpp), every output depends only on its own row of x and
// of W, never on m, the column block or the threads; the two arithmetics sum in different orders, so their
// bits differ (by f32 rounding) and a run uses one of them throughout: the AMX level's.
#pragma once
#include <cmath>
#include <cstdint>

#include "kernels/cpu/linear_bf16dot.hpp"

namespace xmoe::kernels {

inline constexpr int64_t kBf16TileStep = 32;  // k elements per step: 16 pairs

// One step of one output: `acc` plus the step's 32 products of x and w bits (32 each).
inline float bf16tile_step(float acc, const uint16_t* xb, const uint16_t* wb) {
  float even = 0.0f, odd = 0.0f;
  for (int l = 0; l < 16; ++l) {
    even = flush_denormal(std::fma(bf16_operand(xb[2 * l]), bf16_operand(wb[2 * l]), even));
    odd = flush_denormal(std::fma(bf16_operand(xb[2 * l + 1]), bf16_operand(wb[2 * l + 1]), odd));
  }
  return flush_denormal(acc + flush_denormal(even + odd));
}

namespace reference {
// One output of the arithmetic above: x and w rows as bf16 bits, `steps` · 32 of each (zeros past k).
float bf16tile_row(const uint16_t* xb, const uint16_t* wb, int64_t steps);
}  // namespace reference

}  // namespace xmoe::kernels
