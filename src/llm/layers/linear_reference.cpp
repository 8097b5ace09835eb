// The linear layers' oracle: plain loops in the summation order the fast variants share (linear_lanes.hpp),
// so they must agree bit for bit.
#include <cmath>

#include "llm/layers/linear_kernels.hpp"
#include "llm/layers/linear_lanes.hpp"

namespace xmoe::llm::linear_reference {

namespace {
template <class W>
void dot_rows(const float* x, int64_t m, int64_t ldx, const W* w, int64_t k, int64_t n0, int64_t n1, float* y,
              int64_t ldy) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = n0; j < n1; ++j) {
      float lanes[16] = {};
      for (int64_t p = 0; p < k; ++p)
        lanes[p % 16] = std::fma(x[i * ldx + p], static_cast<float>(w[j * k + p]), lanes[p % 16]);
      y[i * ldy + j] = reduce_lanes(lanes);
    }
}
}  // namespace

void f32(const float* x, int64_t m, int64_t ldx, const float* w, int64_t k, int64_t n0, int64_t n1, float* y,
         int64_t ldy) {
  dot_rows(x, m, ldx, w, k, n0, n1, y, ldy);
}
void bf16w(const float* x, int64_t m, int64_t ldx, const bf16* w, int64_t k, int64_t n0, int64_t n1, float* y,
           int64_t ldy) {
  dot_rows(x, m, ldx, w, k, n0, n1, y, ldy);
}

}  // namespace xmoe::llm::linear_reference
