#include "llm/layers/rmsnorm.hpp"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "moe/parallel.hpp"

namespace xmoe::llm {

namespace {

// Rows summed side by side. Each row's sum of squares is one dependent chain of double adds (~4 cycles an
// element); running several rows' chains together hides that latency, and each chain keeps its own order,
// so every row gets the bits the one-row loop gives it (q/k norm runs over 36 head rows per token).
constexpr int64_t kRowsTogether = 8;

}  // namespace

void rms_norm_rows(const float* in, float* out, int64_t rows, int64_t dim, int64_t stride,
                   const float* weight, float eps) {
  moe::parallel_rows(rows, 64, [&](int64_t a, int64_t b) {
    for (int64_t r0 = a; r0 < b; r0 += kRowsTogether) {
      const int64_t n = std::min(kRowsTogether, b - r0);
      // The sum of squares in double: closer to exact than torch's f32 reduction, so the difference to it
      // stays at f32 rounding whatever the order torch uses.
      double ss[kRowsTogether] = {};
      const float* x = in + r0 * stride;
      // `count` is a compile-time constant for full groups, so those loops unroll across the rows.
      const auto sum_squares = [&](auto count) {
        for (int64_t i = 0; i < dim; ++i)
          for (int64_t j = 0; j < count; ++j) {
            const double v = x[j * stride + i];
            ss[j] += v * v;
          }
      };
      if (n == kRowsTogether)
        sum_squares(std::integral_constant<int64_t, kRowsTogether>{});
      else
        sum_squares(n);
      for (int64_t j = 0; j < n; ++j) {
        const float* xr = x + j * stride;
        float* y = out + (r0 + j) * stride;
        const float variance = static_cast<float>(ss[j] / static_cast<double>(dim));
        const float scale = 1.0f / std::sqrt(variance + eps);
        for (int64_t i = 0; i < dim; ++i) y[i] = weight[i] * (xr[i] * scale);
      }
    }
  });
}

}  // namespace xmoe::llm
