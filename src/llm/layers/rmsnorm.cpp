#include "llm/layers/rmsnorm.hpp"

#include <cmath>

#include "moe/parallel.hpp"

namespace xmoe::llm {

void rms_norm_rows(const float* in, float* out, int64_t rows, int64_t dim, int64_t stride,
                   const float* weight, float eps) {
  moe::parallel_rows(rows, 64, [&](int64_t a, int64_t b) {
    for (int64_t r = a; r < b; ++r) {
      const float* x = in + r * stride;
      float* y = out + r * stride;
      // The sum of squares in double: closer to exact than torch's f32 reduction, so the difference to it
      // stays at f32 rounding whatever the order torch uses.
      double ss = 0;
      for (int64_t i = 0; i < dim; ++i) ss += static_cast<double>(x[i]) * x[i];
      const float variance = static_cast<float>(ss / static_cast<double>(dim));
      const float scale = 1.0f / std::sqrt(variance + eps);
      for (int64_t i = 0; i < dim; ++i) y[i] = weight[i] * (x[i] * scale);
    }
  });
}

}  // namespace xmoe::llm
