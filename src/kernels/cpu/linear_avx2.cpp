// AVX2 linear kernels for f32, bf16 and f16 weights: the 16 lanes of the shared summation order
// (linear_lanes.hpp) as two 8-float registers, so results equal the reference's (and the AVX-512 variant's)
// bit for bit.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/linear_lanes.hpp"
#include "kernels/cpu/variants.hpp"

namespace xmoe::kernels::avx2 {
namespace {

struct f16 {  // IEEE binary16 bits (F16C converts them)
  uint16_t bits;
};

inline __m256 load8(const float* p) {
  return _mm256_loadu_ps(p);
}
inline __m256 load8(const bf16* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline __m256 load8(const f16* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// Weight rows start ldw elements apart; each holds k elements.
template <int MR, int NR, class W>
void tile(const float* x, int64_t ldx, const W* w, int64_t ldw, int64_t k, float* y, int64_t ldy) {
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
    for (int j = 0; j < NR; ++j) ws[j] = w + j * ldw + p;
    step(xs, ws);
  }
  if (p < k) {  // the tail, zero-padded to a whole step (zero products leave the lanes unchanged)
    float xt[MR][16] = {};
    W wt[NR][16] = {};
    for (int i = 0; i < MR; ++i)
      std::memcpy(xt[i], x + i * ldx + p, static_cast<size_t>(k - p) * sizeof(float));
    for (int j = 0; j < NR; ++j)
      std::memcpy(static_cast<void*>(wt[j]), w + j * ldw + p, static_cast<size_t>(k - p) * sizeof(W));
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
void rows_block(const float* x, int64_t ldx, const W* w, int64_t ldw, int64_t k, int64_t n0, int64_t n1,
                float* y, int64_t ldy) {
  int64_t j = n0;
  for (; j + NR <= n1; j += NR) tile<MR, NR>(x, ldx, w + j * ldw, ldw, k, y + j, ldy);
  for (; j < n1; ++j) tile<MR, 1>(x, ldx, w + j * ldw, ldw, k, y + j, ldy);
}

template <class W>
void linear(const LinearArgs& a) {
  const W* w = reinterpret_cast<const W*>(a.w->data);
  const int64_t k = a.w->cols, ldw = a.w->row_bytes / int64_t(sizeof(W));
  const int64_t kBlockCols =
      std::max<int64_t>(8, (256 << 10) / std::max<int64_t>(1, k * int64_t(sizeof(W))) / 8 * 8);
  for (int64_t c0 = a.n0; c0 < a.n1; c0 += kBlockCols) {
    const int64_t c1 = std::min(a.n1, c0 + kBlockCols);
    int64_t i = 0;
    for (; i + 2 <= a.m; i += 2)
      rows_block<2, 2>(a.x + i * a.ldx, a.ldx, w, ldw, k, c0, c1, a.y + i * a.ldy, a.ldy);
    if (i < a.m) rows_block<1, 4>(a.x + i * a.ldx, a.ldx, w, ldw, k, c0, c1, a.y + i * a.ldy, a.ldy);
  }
}

}  // namespace

void linear_f32(const LinearArgs& a) {
  linear<float>(a);
}
void linear_bf16(const LinearArgs& a) {
  linear<bf16>(a);
}
void linear_f16(const LinearArgs& a) {
  linear<f16>(a);
}

}  // namespace xmoe::kernels::avx2
