// The AMX level's `medium` oracle for BF16 weights: plain loops emulating linear_bf16tile.hpp's arithmetic
// step by step, which the AMX kernel must match bit for bit.

#include "kernels/cpu/linear_bf16tile.hpp"
#include "kernels/cpu/variants.hpp"

namespace xmoe::kernels::reference {

float bf16tile_row(const uint16_t* xb, const uint16_t* wb, int64_t steps) {
  float acc = 0.0f;
  for (int64_t s = 0; s < steps; ++s)
    acc = bf16tile_step(acc, xb + s * kBf16TileStep, wb + s * kBf16TileStep);
  return acc;
}

void linear_bf16_medium_tile(const LinearArgs& a) {
  linear_bf16_rows(a, bf16tile_row);
}

}  // namespace xmoe::kernels::reference
