// Transposing packer for GEMM operands whose k runs along the rows (op(B) = Bᵀ, untransposed op(A)), in
// 8 × 8 blocks of 32-bit units with AVX2 shuffles: an f32 value, a bf16 value widened to f32, or a bf16
// k-pair (VDPBF16PS's unit). It serves micro-panels of a multiple of 8 rows, which in practice are op(B)'s
// (nr = 16, 32, 64; the mr = 6 and 14 op(A) panels keep the scalar transpose). The scalar transpose stores
// one value at a time, which at the experts' mid shapes (64–512 rows, where op(B) is a 2048 × 2048 weight
// packed for few rows) cost about a sixth of the GEMM's time on Zen 4. Only data movement: the packed values
// are bit-identical to pack_rows's. Included by gemm_blocking.hpp where the ISA file is built with AVX2.
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <type_traits>

#include "xmoe/dtype.hpp"

namespace xmoe::kernels {
namespace {

// Whether pack_rows_avx2<R, KP, P, In> exists: whole 8-row groups of 32-bit packed units.
template <int R, int KP, class P, class In>
constexpr bool kPackRowsAvx2 = R % 8 == 0 &&
                               ((KP == 1 && std::is_same_v<P, float> &&
                                 (std::is_same_v<In, float> || std::is_same_v<In, bf16>)) ||
                                (KP == 2 && std::is_same_v<P, bf16> && std::is_same_v<In, bf16>));

// Eight 32-bit units of a source row starting at unit `u`.
template <int KP, class P, class In>
inline __m256 load_units(const In* row, int64_t u) {
  if constexpr (std::is_same_v<In, bf16> && std::is_same_v<P, float>) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + u));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  } else {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(row + u * KP));
  }
}

// Transposes the 8 × 8 block r[row][unit] in place into r[unit][row].
inline void transpose8(__m256 r[8]) {
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
  const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  r[0] = _mm256_permute2f128_ps(u0, u4, 0x20), r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
  r[2] = _mm256_permute2f128_ps(u2, u6, 0x20), r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
  r[4] = _mm256_permute2f128_ps(u0, u4, 0x31), r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
  r[6] = _mm256_permute2f128_ps(u2, u6, 0x31), r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

// pack_rows's layout for the first `units` whole 32-bit units (a multiple of 8) of `groups` whole 8-row
// groups: unit s of row i goes to panel unit s·R + i. 64-byte stretches of every row in turn, as pack_rows
// walks them (rows `ld` apart share L1 sets).
template <int R, int KP, class P, class In>
void pack_rows_avx2(const In* src, int64_t ld, int64_t groups, int64_t units, P* panel) {
  constexpr int64_t kStretch = 64 / (sizeof(In) * KP) < 8 ? 8 : 64 / (sizeof(In) * KP);  // units per line
  float* out = reinterpret_cast<float*>(panel);
  for (int64_t s0 = 0; s0 < units; s0 += kStretch) {
    const int64_t s1 = s0 + kStretch < units ? s0 + kStretch : units;
    for (int64_t g = 0; g < groups; ++g) {
      const In* rows = src + 8 * g * ld;
      for (int64_t i = 0; i < 8; ++i) __builtin_prefetch(rows + i * ld + (s1 + kStretch) * KP);
      for (int64_t s = s0; s < s1; s += 8) {
        __m256 r[8];
#pragma GCC unroll 8
        for (int i = 0; i < 8; ++i) r[i] = load_units<KP, P>(rows + i * ld, s);
        transpose8(r);
#pragma GCC unroll 8
        for (int q = 0; q < 8; ++q) _mm256_storeu_ps(out + (s + q) * R + 8 * g, r[q]);
      }
    }
  }
}

}  // namespace
}  // namespace xmoe::kernels
