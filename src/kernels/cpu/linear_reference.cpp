// The linear layers' oracle for unscaled formats: plain loops in the summation order the fast variants share
// (linear_lanes.hpp), so they must agree bit for bit. Weights are decoded element by element with
// PackedWeight::row_to_f32's rules (exact for f32, bf16 and f16).
#include <cmath>
#include <vector>

#include "kernels/cpu/linear_lanes.hpp"
#include "kernels/cpu/variants.hpp"

namespace xmoe::kernels::reference {

namespace {
void dot_rows(const LinearArgs& a) {
  const PackedWeight& w = *a.w;
  const int64_t k = w.cols;
  std::vector<float> row(static_cast<size_t>(k));
  for (int64_t j = a.n0; j < a.n1; ++j) {
    w.row_to_f32(j, row.data());
    for (int64_t i = 0; i < a.m; ++i) {
      float lanes[16] = {};
      for (int64_t p = 0; p < k; ++p) lanes[p % 16] = std::fma(a.x[i * a.ldx + p], row[p], lanes[p % 16]);
      a.y[i * a.ldy + j] = reduce_lanes(lanes);
    }
  }
}
}  // namespace

void linear_f32(const LinearArgs& a) {
  dot_rows(a);
}
void linear_bf16(const LinearArgs& a) {
  dot_rows(a);
}
void linear_f16(const LinearArgs& a) {
  dot_rows(a);
}

}  // namespace xmoe::kernels::reference
