// The `medium` precision's oracle for BF16 weights: plain loops emulating linear_bf16dot.hpp's arithmetic
// lane by lane, which the AVX512-BF16 kernel must match bit for bit.

#include "kernels/cpu/linear_bf16dot.hpp"
#include "kernels/cpu/linear_lanes.hpp"
#include "kernels/cpu/variants.hpp"

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
  linear_bf16_rows(a, bf16dot_row);
}

}  // namespace xmoe::kernels::reference
