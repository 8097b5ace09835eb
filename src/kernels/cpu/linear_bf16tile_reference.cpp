// The AMX level's `medium` oracle for BF16 weights: plain loops emulating linear_bf16tile.hpp's arithmetic
// step by step, which the AMX kernel must match bit for bit.
#include <cstring>
#include <vector>

#include "kernels/cpu/linear_bf16tile.hpp"
#include "kernels/cpu/variants.hpp"
#include "xmoe/dtype.hpp"

namespace xmoe::kernels::reference {

float bf16tile_row(const uint16_t* xb, const uint16_t* wb, int64_t steps) {
  float acc = 0.0f;
  for (int64_t s = 0; s < steps; ++s)
    acc = bf16tile_step(acc, xb + s * kBf16TileStep, wb + s * kBf16TileStep);
  return acc;
}

void linear_bf16_medium_tile(const LinearArgs& a) {
  const PackedWeight& w = *a.w;
  const int64_t k = w.cols, steps = (k + kBf16TileStep - 1) / kBf16TileStep, padded = steps * kBf16TileStep;
  // Operands as bf16 bits, zero past k.
  std::vector<uint16_t> xb(static_cast<size_t>(padded)), wb(static_cast<size_t>(padded));
  for (int64_t j = a.n0; j < a.n1; ++j) {
    std::memcpy(wb.data(), w.data + j * w.row_bytes, static_cast<size_t>(k) * 2);
    for (int64_t i = 0; i < a.m; ++i) {
      for (int64_t p = 0; p < k; ++p) xb[p] = bf16::from_float(a.x[i * a.ldx + p]);
      a.y[i * a.ldy + j] = bf16tile_row(xb.data(), wb.data(), steps);
    }
  }
}

}  // namespace xmoe::kernels::reference
