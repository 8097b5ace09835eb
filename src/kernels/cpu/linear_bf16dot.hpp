// The arithmetic of the `medium` matmul precision (linear_precision.hpp) for BF16 weights, which the
// AVX512-BF16 kernel and its scalar reference share:
//  * each activation is rounded to bf16 (nearest even, bf16::from_float);
//  * k is cut into steps of 32; in a step, lane l (0..15) takes the pair (2l, 2l+1) and adds, as VDPBF16PS
//    does, first the odd product and then the even one, each added exactly and rounded once to f32 (nearest
//    even); bf16 denormal operands count as zero and a denormal sum is flushed to a signed zero (the
//    instruction's fixed DAZ/FTZ behaviour, independent of MXCSR). Past k, operands are zeros;
//  * the 16 lanes are added in linear_lanes.hpp's fixed tree.
// So every output depends only on its own row of x and of W, never on m, the column block or the threads.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/packed_weight.hpp"
#include "xmoe/dtype.hpp"

namespace xmoe::kernels {

inline constexpr int64_t kBf16DotStep = 32;  // k elements per step: 16 lanes × a pair

// A bf16 operand as VDPBF16PS reads it: denormals are zero.
inline float bf16_operand(uint16_t bits) {
  if ((bits & 0x7f80u) == 0) bits &= 0x8000u;
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float flush_denormal(float f) {
  return std::fpclassify(f) == FP_SUBNORMAL ? std::copysign(0.0f, f) : f;
}

// One lane of VDPBF16PS: acc + a1·b1, then + a0·b0 (a product of two bf16 is exact; fma rounds each sum
// once).
inline float dpbf16_lane(float acc, uint16_t a0, uint16_t a1, uint16_t b0, uint16_t b1) {
  acc = flush_denormal(std::fma(bf16_operand(a1), bf16_operand(b1), acc));
  return flush_denormal(std::fma(bf16_operand(a0), bf16_operand(b0), acc));
}

namespace reference {
// Every output of `a` as row(x̂, ŵ, steps), the operands as bf16 bits (x rounded to nearest even) and zeros
// past k, `steps` steps of 32: the scalar references' loop over outputs, for any of the bf16-product
// arithmetics.
template <class Row>
void linear_bf16_rows(const LinearArgs& a, const Row& row) {
  const PackedWeight& w = *a.w;
  const int64_t k = w.cols, steps = (k + 31) / 32;
  std::vector<uint16_t> xb(static_cast<size_t>(steps * 32)), wb(xb.size());
  for (int64_t j = a.n0; j < a.n1; ++j) {
    std::memcpy(wb.data(), w.data + j * w.row_bytes, static_cast<size_t>(k) * 2);
    for (int64_t i = 0; i < a.m; ++i) {
      for (int64_t p = 0; p < k; ++p) xb[p] = bf16::from_float(a.x[i * a.ldx + p]);
      a.y[i * a.ldy + j] = row(xb.data(), wb.data(), steps);
    }
  }
}

// One output of the arithmetic above: x and w rows as bf16 bits, `steps` · 32 of each (zeros past k).
// Defined in the reference file, so no vector-ISA copy of it exists.
float bf16dot_row(const uint16_t* xb, const uint16_t* wb, int64_t steps);
}  // namespace reference

}  // namespace xmoe::kernels
