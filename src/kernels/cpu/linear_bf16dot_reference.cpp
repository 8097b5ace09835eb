// The `medium` precision's oracle for BF16 weights: plain loops emulating linear_bf16dot.hpp's arithmetic
// lane by lane, which the AVX512-BF16 kernel must match bit for bit.
#include <vector>

#include "kernels/cpu/linear_bf16dot.hpp"
#include "kernels/cpu/linear_lanes.hpp"
#include "kernels/cpu/variants.hpp"
#include "xmoe/dtype.hpp"

namespace xmoe::kernels::reference {

float bf16dot_row(const uint16_t* xb, const uint16_t* wb, int64_t steps) {
  float lanes[16] = {};
  for (int64_t s = 0; s < steps; ++s)
    for (int l = 0; l < 16; ++l) {
      const int64_t p = s * kBf16DotStep + 2 * l;
      lanes[l] = dpbf16_lane(lanes[l], xb[p], xb[p + 1], wb[p], wb[p + 1]);
    }
  return reduce_lanes(lanes);
}

void linear_bf16_medium(const LinearArgs& a) {
  const PackedWeight& w = *a.w;
  const int64_t k = w.cols, steps = (k + kBf16DotStep - 1) / kBf16DotStep, padded = steps * kBf16DotStep;
  // Operands as bf16 bits, zero past k.
  std::vector<uint16_t> xb(static_cast<size_t>(padded)), wb(static_cast<size_t>(padded));
  for (int64_t j = a.n0; j < a.n1; ++j) {
    std::memcpy(wb.data(), w.data + j * w.row_bytes, static_cast<size_t>(k) * 2);
    for (int64_t i = 0; i < a.m; ++i) {
      for (int64_t p = 0; p < k; ++p) xb[p] = bf16::from_float(a.x[i * a.ldx + p]);
      a.y[i * a.ldy + j] = bf16dot_row(xb.data(), wb.data(), steps);
    }
  }
}

}  // namespace xmoe::kernels::reference
