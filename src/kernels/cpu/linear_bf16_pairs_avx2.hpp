// AVX2 batched decode and few-row products (from 4 rows, takes_rows) over BF16 weights, with the weights
// widened as pairs: a 32-bit word of a BF16 row holds elements 2l (low half) and 2l + 1 (high half), so
// `word << 16` is element 2l as f32 and `word & 0xFFFF0000` element 2l + 1 — one integer op per 8 weights and
// no shuffle, where widening 8 in place (`vpmovzxwd` + shift, linear_avx2.cpp's load8) costs two, one of them
// on the shuffle port. The lanes of the shared summation order (linear_lanes.hpp) then sit in two registers
// by parity instead of by half: the even register holds lanes 0, 2, …, 14 and the odd one lanes 1, 3, …, 15,
// each lane the same FMA chain over the same p as before, and reduce_pairs adds them in the fixed tree's
// order. So the bits are the reference's.
//
// Each parity is its own pass over k, so a tile needs only its rows × weight rows accumulators of 8 lanes and
// can be 6 x rows × 2 weight rows (12 accumulators, 2 weights, 1 x and the mask: all 16 registers) instead of
// 3 × 2 × 2 halves; every weight vector widened feeds 6 FMAs rather than 3. Tiles of up to 4 x rows (4 and 8
// rows: batched decode) take 3 weight rows (12 accumulators, 3 weights, 1 x: the odd pass ANDs with the mask
// in memory), since 4 × 2's 8 accumulators are just the FMA latency's worth and any stall shows. (3 weight
// rows × 4 x rows with the mask in a register needs a 17th and ran at 77 GFLOP/s in L1 against 6 × 2's 107.)
// The odd pass reads the weight rows again from cache. Include only from files compiled with the AVX2 flags.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <iterator>

#include "kernels/cpu/l1_blocks.hpp"
#include "kernels/cpu/linear_panels_avx2.hpp"
#include "kernels/cpu/prefetch_slice.hpp"
#include "util/buffer.hpp"

namespace xmoe::kernels::avx2::bf16_pairs {

constexpr int kTileRows = 6;
constexpr int kGroupRows = 2;        // weight rows per tile of 5 or 6 x rows
constexpr int kNarrowGroupRows = 3;  // per tile of up to 4 x rows
// One thread capped at AVX2 on Zen 4 (`xmoe linear-bench --threads 1 --clock thread --isa avx2 --rows 4,8`,
// alternated builds), GFLOP/s with 2 weight rows → 3: 1536 × 2048 at 4 rows 71-73 → 83-84, 8 rows 80-83 →
// 88-90; 2048 × 768 at 8 rows 70-71 → 77-80; 2048 × 4096 at 8 rows 78-81 → 86-87. Tiles of at most 4 rows
// for 8 rows and more too (16 as 4 × 4 instead of 6 + 5 + 5) gained nothing.
inline int64_t group_rows(int64_t h) {
  return h <= 4 ? kNarrowGroupRows : kGroupRows;
}

// Whether m x rows of k columns run here rather than in the panel GEMM (linear_panels_avx2.hpp): from 4 rows
// while the packed x rows fit in 1 MiB (each set of weight rows reads them all again, at 2 bytes per FMA).
// One thread on Sapphire Rapids capped at AVX2, alternated builds (`xmoe linear-bench --threads 1 --clock
// thread --isa avx2 --rows 17,24,32,48,64,96,128,256,512`, k = 2048 and 768): 17 rows 51-57 → 66-76
// GFLOP/s, 32 rows 63-64 → 75-87, 64 rows 64-67 → 78-89, 128 rows 70-72 → 79-88; 256 rows (2 MiB of x at k
// = 2048) still 70-81 against 69-73, 512 rows 70-74 against 72-77.
inline bool takes_rows(int64_t m, int64_t k) {
  return m >= 4 && m * k * int64_t(sizeof(float)) <= (1 << 20);
}

// The even lanes' register e (lanes 0, 2, …, 14) and the odd lanes' o (1, 3, …, 15) reduced as
// reduce_lanes does: l + 8 (within each register's halves), l + 4, l + 2, then the even sum + the odd sum.
inline float reduce_pairs(__m256 e, __m256 o) {
  const __m128 e4 = _mm_add_ps(_mm256_castps256_ps128(e), _mm256_extractf128_ps(e, 1));
  const __m128 o4 = _mm_add_ps(_mm256_castps256_ps128(o), _mm256_extractf128_ps(o, 1));
  const __m128 e2 = _mm_add_ps(e4, _mm_movehl_ps(e4, e4));
  const __m128 o2 = _mm_add_ps(o4, _mm_movehl_ps(o4, o4));
  const __m128 e1 = _mm_add_ss(e2, _mm_shuffle_ps(e2, e2, 1));
  const __m128 o1 = _mm_add_ss(o2, _mm_shuffle_ps(o2, o2, 1));
  return _mm_cvtss_f32(_mm_add_ss(e1, o1));
}

// m rows in tiles of at most kTileRows, of nearly equal heights (as the panel GEMM splits them).
inline int64_t tile_count(int64_t m) {
  return panels::tile_count(m, kTileRows);
}
inline int64_t tile_start(int64_t m, int64_t t) {
  return panels::tile_start(m, t, kTileRows);
}

// x rows [0, m) by parity, then tile by tile as [step][row][8]: parity 0 holds elements 16s + 2l, parity 1
// elements 16s + 2l + 1, zeros past k. Tile t of parity p (rows i0..i0+h) starts at (p · m + i0) · steps · 8,
// so a tile's pass reads one contiguous stream.
inline void pack_x(const float* x, int64_t ldx, int64_t m, int64_t k, float* out) {
  const int64_t steps = (k + 15) / 16;
  for (int64_t t = 0; t < tile_count(m); ++t) {
    const int64_t i0 = tile_start(m, t), h = tile_start(m, t + 1) - i0;
    for (int64_t r = 0; r < h; ++r)
      for (int64_t s = 0; s < steps; ++s) {
        alignas(32) float v[16];
        const float* src = x + (i0 + r) * ldx + s * 16;
        if (s * 16 + 16 > k) {  // the tail, zeros past k
          std::fill(std::begin(v), std::end(v), 0.0f);
          std::memcpy(v, src, static_cast<size_t>(k - s * 16) * sizeof(float));
          src = v;
        }
        // Within each 128-bit half, shuffle_ps picks lo's and hi's even (or odd) elements; the 64-bit
        // permute puts lo's four before hi's four.
        const __m256 lo = _mm256_loadu_ps(src), hi = _mm256_loadu_ps(src + 8);
        float* const even = out + ((0 * m + i0) * steps + s * h + r) * 8;
        float* const odd = out + ((1 * m + i0) * steps + s * h + r) * 8;
        _mm256_store_ps(even, _mm256_castpd_ps(_mm256_permute4x64_pd(
                                  _mm256_castps_pd(_mm256_shuffle_ps(lo, hi, 0x88)), 0xD8)));
        _mm256_store_ps(odd, _mm256_castpd_ps(_mm256_permute4x64_pd(
                                 _mm256_castps_pd(_mm256_shuffle_ps(lo, hi, 0xDD)), 0xD8)));
      }
  }
}

// The odd elements' mask, for tiles with no register left for it.
alignas(32) inline constexpr uint32_t kHighHalves[8] = {0xFFFF0000u, 0xFFFF0000u, 0xFFFF0000u, 0xFFFF0000u,
                                                        0xFFFF0000u, 0xFFFF0000u, 0xFFFF0000u, 0xFFFF0000u};

// One parity's pass of an MR × NR tile over steps [s0, s1): x rows at xs (row i of step s at xs + (s · MR +
// i) · 8), weight row j's step s at w + j · ldw + 16 s for s < full, and step `full` (when it is below s1: k
// has a tail) the zero-padded tail at tail + 16 j. The 8-lane accumulators start at zero when s0 is 0 and
// from acc + (i · NR + j) · 8 otherwise (the same chain, resumed), and are stored there. Prefetches [next,
// next + next_bytes) into L2 evenly over its steps (its share of the next set's rows; see set_of_rows).
template <int MR, int NR, int Parity>
void tile(const float* xs, const uint16_t* w, int64_t ldw, int64_t s0, int64_t s1, int64_t full,
          const uint16_t* tail, float* acc_io, const char* next, int64_t next_bytes) {
  __m256 acc[MR][NR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j)
      acc[i][j] = s0 == 0 ? _mm256_setzero_ps() : _mm256_load_ps(acc_io + (i * NR + j) * 8);
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  const auto step = [&](const float* px, const uint16_t* const* ws) {
    __m256 wv[NR];
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) {
      __m256i words = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ws[j]));
      if constexpr (Parity == 0) {
        words = _mm256_slli_epi32(words, 16);
      } else if constexpr (MR * NR + NR + 1 >= 16) {
        // No register left for the mask: AND with it in memory.
        asm("vpand %1, %0, %0" : "+x"(words) : "m"(kHighHalves));
      } else {
        words = _mm256_and_si256(words, high);
      }
      wv[j] = _mm256_castsi256_ps(words);
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      __m256 xv = _mm256_load_ps(px + i * 8);
      asm("" : "+x"(xv));  // one load per x vector (as in panels::panel_tile)
#pragma GCC unroll 4
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  };
  const uint16_t* ws[NR];
  const int64_t whole = std::min(s1, full);
  PrefetchEvenly ahead(next, next_bytes, whole - s0);
  for (int64_t s = s0; s < whole; ++s) {
    ahead.step();
    for (int j = 0; j < NR; ++j) ws[j] = w + j * ldw + s * 16;
    step(xs + s * MR * 8, ws);
  }
  if (full < s1) {
    for (int j = 0; j < NR; ++j) ws[j] = tail + j * 16;
    step(xs + full * MR * 8, ws);
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) _mm256_store_ps(acc_io + (i * NR + j) * 8, acc[i][j]);
}

using TileFn = void (*)(const float*, const uint16_t*, int64_t, int64_t, int64_t, int64_t, const uint16_t*,
                        float*, const char*, int64_t);
// tile<MR, NR, Parity> as kTileFns[NR - 1][Parity][MR]; none past 12 accumulators (3 weight rows: up to 4 x
// rows, group_rows).
template <int MR, int NR, int Parity>
constexpr TileFn tile_fn() {
  if constexpr (MR * NR > kTileRows * kGroupRows)
    return nullptr;
  else
    return tile<MR, NR, Parity>;
}
template <int NR, int Parity>
constexpr TileFn kTileRow[kTileRows + 1] = {nullptr,
                                            tile_fn<1, NR, Parity>(),
                                            tile_fn<2, NR, Parity>(),
                                            tile_fn<3, NR, Parity>(),
                                            tile_fn<4, NR, Parity>(),
                                            tile_fn<5, NR, Parity>(),
                                            tile_fn<6, NR, Parity>()};
constexpr const TileFn* kTileFns[kNarrowGroupRows][2] = {
    {kTileRow<1, 0>, kTileRow<1, 1>}, {kTileRow<2, 0>, kTileRow<2, 1>}, {kTileRow<3, 0>, kTileRow<3, 1>}};

// Weight rows [0, rows) (rows ≤ kSetRows) against all m packed x rows. The x tiles are outermost: a tile's
// rows of one parity (6 rows × k/2 floats, 24 KiB at k = 2048) stay in L1 while every group of weight rows in
// the set (16 rows × k, 64 KiB of bf16, in L2 after the first tile) runs over them, so the loads from L2 are
// the weights', 32 bytes per 6 FMAs. Streaming all m x rows past each pair instead takes 32 bytes per 2 FMAs
// from L2: on Sapphire Rapids that ran as fast (its L2 feeds 64 bytes a cycle), but it is Zen 3's whole
// L2-to-L1 rate of 32 bytes a cycle at two FMAs a cycle. Every pass prefetches its share of the next set
// (next_bytes from next) into L2.
constexpr int kSetRows = 16;

// A tile's rows of one parity that take more than kTileWholeBytes (k = 4096, attention's output projection:
// 4 rows are 32 KiB, all of Zen 3's and Zen 4's L1) run their passes over equal blocks of steps of at most
// kTileBlockBytes, each pair's accumulators kept between them, so that the block stays in L1 beside the
// weights. One thread capped at AVX2 on Zen 4 (a 2-vCPU VM, `xmoe linear-bench --threads 1 --clock thread
// --isa avx2 --rows 4,8,16`, alternated builds), 2048 × 4096: 4 rows 42 → 67-69 GFLOP/s, 8 rows 54 → 81, 16
// rows 65-66 → 86-89, as 4096 × 2048 runs (75 / 84 / 89-91); blocks of up to 24 KiB (two unequal ones at 4
// rows) gave 52-55 / 64-66 / 85-86. Blocks at k = 2048 too (6 rows: 24 KiB) lost 4-8 % at 16 rows.
constexpr int64_t kTileWholeBytes = 24 << 10;
constexpr int64_t kTileBlockBytes = 16 << 10;

inline void set_of_rows(const float* xp, int64_t m, int64_t k, const uint16_t* w, int64_t ldw, int64_t rows,
                        float* y, int64_t ldy, const char* next, int64_t next_bytes) {
  const int64_t steps = (k + 15) / 16, full = k / 16;
  alignas(32) uint16_t tail[kSetRows][16];  // read only when k has a tail
  if (full < steps) {
    std::memset(tail, 0, sizeof tail);
    for (int64_t j = 0; j < rows; ++j)
      std::memcpy(tail[j], w + j * ldw + full * 16, static_cast<size_t>(k - full * 16) * sizeof(uint16_t));
  }
  const auto groups_of = [&](int64_t h) { return (rows + group_rows(h) - 1) / group_rows(h); };
  // Steps per pass of a tile of h rows (8 floats a row and step): all of them, or equal blocks.
  const auto block_steps = [&](int64_t h) {
    return units_per_block(steps, h * 8 * int64_t(sizeof(float)), kTileWholeBytes, kTileBlockBytes);
  };
  int64_t passes = 0;
  for (int64_t t = 0; t < tile_count(m); ++t) {
    const int64_t h = tile_start(m, t + 1) - tile_start(m, t), bs = block_steps(h);
    passes += (steps + bs - 1) / bs * 2 * groups_of(h);
  }
  // Each group's accumulators (at most 12 of 8 lanes: 6 × 2 or 4 × 3), for both parities.
  alignas(32) float acc[2][(kSetRows + kGroupRows - 1) / kGroupRows][kTileRows * kGroupRows * 8];
  for (int64_t t = 0, pass = 0; t < tile_count(m); ++t) {
    const int64_t i0 = tile_start(m, t), h = tile_start(m, t + 1) - i0, bs = block_steps(h);
    const int64_t gr = group_rows(h), groups = groups_of(h);
    for (int64_t s0 = 0; s0 < steps; s0 += bs)
      for (int parity = 0; parity < 2; ++parity)
        for (int64_t g = 0; g < groups; ++g, ++pass) {
          const int64_t j0 = g * gr, nr = std::min(gr, rows - j0);
          const WeightSpan ahead = share_of(next, next_bytes, pass, passes);
          kTileFns[nr - 1][parity][h](xp + (parity * m + i0) * steps * 8, w + j0 * ldw, ldw, s0,
                                      std::min(steps, s0 + bs), full, tail[j0], acc[parity][g], ahead.data,
                                      ahead.bytes);
        }
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t j0 = g * gr, nr = std::min(gr, rows - j0);
      for (int64_t i = 0; i < h; ++i)
        for (int64_t j = 0; j < nr; ++j)
          y[(i0 + i) * ldy + j0 + j] = reduce_pairs(_mm256_load_ps(acc[0][g] + (i * nr + j) * 8),
                                                    _mm256_load_ps(acc[1][g] + (i * nr + j) * 8));
    }
  }
}

// y[i, n] for i < m (takes_rows(m, k)), n in [n0, n1): weight rows in sets of kSetRows, each set
// prefetching the next into L2 while it runs.
inline void linear_few_rows(const float* x, int64_t ldx, int64_t m, const uint16_t* w, int64_t ldw, int64_t k,
                            int64_t n0, int64_t n1, float* y, int64_t ldy) {
  const int64_t steps = (k + 15) / 16;
  Buffer<float> x_buffer;
  float* const xp = x_buffer.ensure(static_cast<size_t>(2 * steps * m * 8));
  pack_x(x, ldx, m, k, xp);
  const auto row_ptr = [&](int64_t j) { return reinterpret_cast<const char*>(w + j * ldw); };
  const auto bytes_of_rows = [&](int64_t a, int64_t b) { return (b - a) * ldw * int64_t(sizeof(uint16_t)); };
  for (int64_t j = n0; j < n1; j += kSetRows) {
    const int64_t rows = std::min<int64_t>(kSetRows, n1 - j), next = j + rows;
    set_of_rows(xp, m, k, w + j * ldw, ldw, rows, y + j, ldy, row_ptr(next),
                bytes_of_rows(next, std::min(n1, next + kSetRows)));
  }
}

}  // namespace xmoe::kernels::avx2::bf16_pairs
