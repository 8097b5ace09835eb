// RMSNorm as transformers' Qwen3MoeRMSNorm: x · rsqrt(mean(x²) + eps) · weight, in f32.
#pragma once
#include <cstdint>

namespace xmoe::llm {

// rows of `dim` values, `stride` apart; in == out allowed. weight: [dim] f32.
void rms_norm_rows(const float* in, float* out, int64_t rows, int64_t dim, int64_t stride,
                   const float* weight, float eps);

}  // namespace xmoe::llm
