// The fixed lane tree of linear_lanes.hpp (l + 8, l + 4, l + 2, l + 1) applied to up to 16 accumulators at
// once: each level adds the same lane pairs as reduce16 does for one accumulator, with two accumulators'
// halves side by side in one 512-bit register, so a tile's outputs cost about 3 instructions each instead of
// 11 and keep their bits (each sum is the same two values; f32 addition is commutative). maskz forms: the
// unmasked shuffle and permute start from an undefined register, which GCC 12 warns about.
#pragma once
#include <immintrin.h>

#include <cstdint>

namespace xmoe::kernels::lane_tree {

// reduce_lanes (linear_lanes.hpp) in registers: halves (l + 8), quarters (l + 4), pairs (l + 2), neighbours.
inline float reduce16(__m512 v) {
  const __m256 s8 =
      _mm256_add_ps(_mm512_maskz_extractf32x8_ps(0xff, v, 0), _mm512_maskz_extractf32x8_ps(0xff, v, 1));
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  const __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
  return _mm_cvtss_f32(s1);
}

// out[q] = the tree sum of v[q] for q < count (≤ 16); the missing accumulators count as zeros.
template <int count>
[[gnu::always_inline]] inline void reduce_many(const __m512* v, float* out) {
  static_assert(count >= 1 && count <= 16);
  const auto at = [&](int q) __attribute__((always_inline)) {
    return q < count ? v[q] : _mm512_setzero_ps();
  };
  // l + 8: accumulators 2r and 2r + 1 → s8[r] = [a 8 lanes | b 8 lanes].
  __m512 s8[8];
#pragma GCC unroll 8
  for (int r = 0; r < 8; ++r) {
    const __m512 a = at(2 * r), b = at(2 * r + 1);
    s8[r] = _mm512_add_ps(_mm512_maskz_shuffle_f32x4(0xffff, a, b, 0x44),
                          _mm512_maskz_shuffle_f32x4(0xffff, a, b, 0xee));
  }
  // l + 4: s4[r] = [4 lanes of each of accumulators 4r .. 4r + 3].
  __m512 s4[4];
#pragma GCC unroll 4
  for (int r = 0; r < 4; ++r)
    s4[r] = _mm512_add_ps(_mm512_maskz_shuffle_f32x4(0xffff, s8[2 * r], s8[2 * r + 1], 0x88),
                          _mm512_maskz_shuffle_f32x4(0xffff, s8[2 * r], s8[2 * r + 1], 0xdd));
  // l + 2: block b of s2[r] = [2 lanes of accumulator 4·(2r) + b, 2 lanes of accumulator 4·(2r + 1) + b].
  __m512 s2[2];
#pragma GCC unroll 2
  for (int r = 0; r < 2; ++r)
    s2[r] = _mm512_add_ps(_mm512_shuffle_ps(s4[2 * r], s4[2 * r + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                          _mm512_shuffle_ps(s4[2 * r], s4[2 * r + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  // l + 1: lane 4b + i = accumulator 4i + b.
  const __m512 s1 = _mm512_add_ps(_mm512_shuffle_ps(s2[0], s2[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                  _mm512_shuffle_ps(s2[0], s2[1], _MM_SHUFFLE(3, 1, 3, 1)));
  // Back to accumulator order: out[q] = lane 4 (q mod 4) + q / 4.
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  const __m512 sums = _mm512_maskz_permutexvar_ps(0xffff, order, s1);
  _mm512_mask_storeu_ps(out, static_cast<__mmask16>((1u << count) - 1), sums);
}

// y[i · ldy + j] = the tree sum of acc[i][j] for an MR × NR tile of accumulators.
template <int MR, int NR>
[[gnu::always_inline]] inline void store_tile(const __m512 (&acc)[MR][NR], float* y, int64_t ldy) {
  constexpr int kAll = MR * NR;
  const __m512* flat = &acc[0][0];
  float sums[kAll];
  constexpr int kFirst = kAll < 16 ? kAll : 16;
  reduce_many<kFirst>(flat, sums);
  if constexpr (kAll > 16) {
    static_assert(kAll <= 32);
    reduce_many<kAll - 16>(flat + 16, sums + 16);
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) y[i * ldy + j] = sums[i * NR + j];
}

// A tile's outputs: store_tile from 4 accumulators on, reduce16 one by one below (fewer instructions there).
// Unrolled, so the accumulators stay registers. The reductions here are always inlined: in tiles that run
// side work between their steps (bf16dot_tiles_avx512_bf16.hpp) GCC left them out of line, took the
// accumulators' address and stored all of them to the stack at every step (FP8 panels at 32 x rows: 185 → 70
// GFLOP/s).
template <int MR, int NR>
[[gnu::always_inline]] inline void store_sums(const __m512 (&acc)[MR][NR], float* y, int64_t ldy) {
  if constexpr (MR * NR >= 4) {
    store_tile<MR, NR>(acc, y, ldy);
  } else {
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) y[i * ldy + j] = reduce16(acc[i][j]);
  }
}

}  // namespace xmoe::kernels::lane_tree
