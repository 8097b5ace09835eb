// AVX2 linear kernels: the 16 lanes of the shared summation order (linear_lanes.hpp) as two 8-float
// registers, so results equal the reference's (and the AVX-512 variant's) bit for bit.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "llm/layers/linear_kernels.hpp"
#include "llm/layers/linear_lanes.hpp"

namespace xmoe::llm::linear_avx2 {
namespace {

inline __m256 load8(const float* p) {
  return _mm256_loadu_ps(p);
}
inline __m256 load8(const bf16* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

template <int MR, int NR, class W>
void tile(const float* x, int64_t ldx, const W* w, int64_t k, float* y, int64_t ldy) {
  __m256 lo[MR][NR], hi[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) lo[i][j] = hi[i][j] = _mm256_setzero_ps();
  auto step = [&](const float* const* xs, const W* const* ws) {
    for (int j = 0; j < NR; ++j) {
      const __m256 wl = load8(ws[j]), wh = load8(ws[j] + 8);
      for (int i = 0; i < MR; ++i) {
        lo[i][j] = _mm256_fmadd_ps(_mm256_loadu_ps(xs[i]), wl, lo[i][j]);
        hi[i][j] = _mm256_fmadd_ps(_mm256_loadu_ps(xs[i] + 8), wh, hi[i][j]);
      }
    }
  };
  const float* xs[MR];
  const W* ws[NR];
  int64_t p = 0;
  for (; p + 16 <= k; p += 16) {
    for (int i = 0; i < MR; ++i) xs[i] = x + i * ldx + p;
    for (int j = 0; j < NR; ++j) ws[j] = w + j * k + p;
    step(xs, ws);
  }
  if (p < k) {  // the tail, zero-padded to a whole step (zero products leave the lanes unchanged)
    float xt[MR][16] = {};
    W wt[NR][16] = {};
    for (int i = 0; i < MR; ++i)
      std::memcpy(xt[i], x + i * ldx + p, static_cast<size_t>(k - p) * sizeof(float));
    for (int j = 0; j < NR; ++j)
      std::memcpy(static_cast<void*>(wt[j]), w + j * k + p, static_cast<size_t>(k - p) * sizeof(W));
    for (int i = 0; i < MR; ++i) xs[i] = xt[i];
    for (int j = 0; j < NR; ++j) ws[j] = wt[j];
    step(xs, ws);
  }
  alignas(32) float lanes[16];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) {
      _mm256_store_ps(lanes, lo[i][j]);
      _mm256_store_ps(lanes + 8, hi[i][j]);
      y[i * ldy + j] = reduce_lanes(lanes);
    }
}

template <int MR, int NR, class W>
void rows_block(const float* x, int64_t ldx, const W* w, int64_t k, int64_t n0, int64_t n1, float* y,
                int64_t ldy) {
  int64_t j = n0;
  for (; j + NR <= n1; j += NR) tile<MR, NR>(x, ldx, w + j * k, k, y + j, ldy);
  for (; j < n1; ++j) tile<MR, 1>(x, ldx, w + j * k, k, y + j, ldy);
}

template <class W>
void linear(const float* x, int64_t m, int64_t ldx, const W* w, int64_t k, int64_t n0, int64_t n1, float* y,
            int64_t ldy) {
  const int64_t kBlockCols =
      std::max<int64_t>(8, (256 << 10) / std::max<int64_t>(1, k * int64_t(sizeof(W))) / 8 * 8);
  for (int64_t c0 = n0; c0 < n1; c0 += kBlockCols) {
    const int64_t c1 = std::min(n1, c0 + kBlockCols);
    int64_t i = 0;
    for (; i + 2 <= m; i += 2) rows_block<2, 2>(x + i * ldx, ldx, w, k, c0, c1, y + i * ldy, ldy);
    if (i < m) rows_block<1, 4>(x + i * ldx, ldx, w, k, c0, c1, y + i * ldy, ldy);
  }
}

}  // namespace

void f32(const float* x, int64_t m, int64_t ldx, const float* w, int64_t k, int64_t n0, int64_t n1, float* y,
         int64_t ldy) {
  linear(x, m, ldx, w, k, n0, n1, y, ldy);
}
void bf16w(const float* x, int64_t m, int64_t ldx, const bf16* w, int64_t k, int64_t n0, int64_t n1, float* y,
           int64_t ldy) {
  linear(x, m, ldx, w, k, n0, n1, y, ldy);
}

}  // namespace xmoe::llm::linear_avx2
