// AVX-512 batched decode and few-row products (4 to ~64 rows, takes_rows) over BF16 weights widened as pairs,
// as on AVX2 (linear_bf16_pairs_avx2.hpp): a 32-bit word of a BF16 row holds elements 2l and 2l + 1, so
// placing its low half in the high half of a zero dword widens element 2l and clearing its low half widens 2l
// + 1. Here one `vpshufb` does both for a 16-column step: the step's 32 bytes are loaded into both halves of
// a register (a broadcast load, no shuffle port) and the byte shuffle puts elements 0, 2, …, 14 in the low
// half and 1, 3, …, 15 in the high half, as f32. One shuffle per 16 weights and nothing else, where the
// former kernel's load_w32 spent a `vpermw`, a shift and a mask per 32 — 1.5 ops per 16 — and on Sapphire
// Rapids every one of them takes a slot of the two ports that also run the 512-bit FMAs. (On Zen 4 shuffles
// share the FMA pipes and shifts do not, so there the two cost about the same per FMA; not measured.) maskz
// forms: the unmasked broadcast and permute start from an undefined register, which GCC 12 warns about.
//
// The accumulators then hold the 16 lanes of the shared summation order (linear_lanes.hpp) as [0, 2, …, 14 |
// 1, 3, …, 15] — lane l's chain is the same FMAs over the same p — and each is permuted back to lane order
// before the fixed tree (lane_tree::store_sums), so the bits are the reference's. x rows are packed in the
// same order. Tiles are up to 6 x rows × 4 weight rows (24 accumulators, 4 weights, 1 x and the shuffle
// control of the 32 registers); each group of 4 weight rows streams once per call, the tiles over it
// prefetching the next group into L2. One thread on Sapphire Rapids, operands in L1 or L2, 512-bit FMA peak
// 239 GFLOP/s: this tile 150–170 GFLOP/s, the former 4 × 5 tile 110–131. Include only from files compiled
// with the AVX-512 flags (F, BW).
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <utility>

#include "kernels/cpu/linear_panels_avx512.hpp"
#include "kernels/cpu/linear_reduce_avx512.hpp"
#include "kernels/cpu/prefetch_slice.hpp"
#include "util/buffer.hpp"

namespace xmoe::kernels::avx512::bf16_pairs {

constexpr int kTileRows = 6;
constexpr int kGroupRows = 4;  // weight rows per tile

// Whether m x rows of k columns run here rather than in the panel GEMM (linear_panels_avx512.hpp): up to 16
// rows (batched decode), and beyond while the packed x rows fit in 512 KiB, half of Zen 4's L2 (every group
// of weight rows reads all of them again). One thread on Sapphire Rapids, k = 2048 and 768, alternated builds
// (`xmoe linear-bench --threads 1 --clock thread --isa avx512 --rows 17,24,32,48,64,96,128,256,512`): 17
// rows 72-88 → 88-110 GFLOP/s, 32 rows 100-112 → 113-130, 64 rows 118-127 → 130-148 (the experts' rows at
// a 512-token prefill: 32 on average); level at 96-128, and at 256 rows (2 MiB of x) 60-70 % of the panels'.
inline bool takes_rows(int64_t m, int64_t k) {
  return m >= 4 && (m <= 16 || m * k * int64_t(sizeof(float)) <= (512 << 10));
}

// m rows in tiles of at most kTileRows, of nearly equal heights (as the panel GEMM splits them).
inline int64_t tile_count(int64_t m) {
  return panels::tile_count(m, kTileRows);
}
inline int64_t tile_start(int64_t m, int64_t t) {
  return panels::tile_start(m, t, kTileRows);
}

// The vpshufb control: within each 128-bit lane, dword d of the low half takes word 2d' (its low word) and
// of the high half word 2d' + 1, each into the dword's high half over a zero low half.
inline __m512i pair_control() {
  alignas(64) static constexpr uint8_t kControl[64] = {
      0x80, 0x80, 0, 1, 0x80, 0x80, 4, 5, 0x80, 0x80, 8,  9,  0x80, 0x80, 12, 13,   // words 0, 2, 4, 6
      0x80, 0x80, 0, 1, 0x80, 0x80, 4, 5, 0x80, 0x80, 8,  9,  0x80, 0x80, 12, 13,   // 8, 10, 12, 14
      0x80, 0x80, 2, 3, 0x80, 0x80, 6, 7, 0x80, 0x80, 10, 11, 0x80, 0x80, 14, 15,   // 1, 3, 5, 7
      0x80, 0x80, 2, 3, 0x80, 0x80, 6, 7, 0x80, 0x80, 10, 11, 0x80, 0x80, 14, 15};  // 9, 11, 13, 15
  return _mm512_load_si512(kControl);
}

// 16 weights p[0..15] as [p0, p2, …, p14 | p1, p3, …, p15] in f32.
inline __m512 load_pairs(const uint16_t* p, __m512i control) {
  const __m256i words = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_shuffle_epi8(_mm512_maskz_broadcast_i64x4(0xff, words), control));
}
// The same for the first `count` (< 16) weights, zeros after.
inline __m512 load_pairs_tail(const uint16_t* p, int64_t count, __m512i control) {
  const __m256i words = _mm256_maskz_loadu_epi16(static_cast<__mmask16>((1u << count) - 1), p);
  return _mm512_castsi512_ps(_mm512_shuffle_epi8(_mm512_maskz_broadcast_i64x4(0xff, words), control));
}

// x rows [0, m) tile by tile as [step][row][16] in pair order (elements 16s + 0, 2, …, 14, then 16s + 1, 3,
// …, 15), zeros past k; tile t starts at tile_start(m, t) · steps · 16.
inline void pack_x(const float* x, int64_t ldx, int64_t m, int64_t k, float* out) {
  const int64_t steps = (k + 15) / 16;
  const __m512i order = _mm512_set_epi32(15, 13, 11, 9, 7, 5, 3, 1, 14, 12, 10, 8, 6, 4, 2, 0);
  for (int64_t t = 0; t < tile_count(m); ++t) {
    const int64_t i0 = tile_start(m, t), h = tile_start(m, t + 1) - i0;
    for (int64_t r = 0; r < h; ++r)
      for (int64_t s = 0; s < steps; ++s) {
        const int64_t n = std::min<int64_t>(16, k - s * 16);
        const __m512 v =
            _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << n) - 1), x + (i0 + r) * ldx + s * 16);
        _mm512_store_ps(out + (i0 * steps + s * h + r) * 16, _mm512_maskz_permutexvar_ps(0xffff, order, v));
      }
  }
}

// y[i, j] for the MR x rows of one packed tile (xt: [step][MR][16]) and NR weight rows read in place;
// prefetches [next, next + next_bytes) into L2 over its steps: a fixed NR lines a step, the rate at which it
// reads its own rows, when it is the group's only tile, else evenly over all its steps (see group).
template <int MR, int NR, bool Evenly>
void tile(const float* xt, const uint16_t* w, int64_t ldw, int64_t k, float* y, int64_t ldy, const char* next,
          int64_t next_bytes) {
  __m512 acc[MR][NR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
  const __m512i control = pair_control();
  const auto step = [&](const float* px, const __m512(&wv)[NR]) {
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      __m512 xv = _mm512_load_ps(px + i * 16);
      asm("" : "+v"(xv));  // one load per x vector: GCC would fold it into each of the NR FMAs
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  };
  constexpr int64_t kStepBytes = NR * 16 * int64_t(sizeof(uint16_t));
  const int64_t full = k / 16;
  PrefetchEvenly ahead(next, next_bytes, full);
  for (int64_t s = 0; s < full; ++s) {
    if constexpr (Evenly)
      ahead.step();
    else
      prefetch_slice(next, s * kStepBytes, kStepBytes, next_bytes);
    __m512 wv[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) wv[j] = load_pairs(w + j * ldw + s * 16, control);
    step(xt + s * MR * 16, wv);
  }
  if (full * 16 < k) {
    __m512 wv[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) wv[j] = load_pairs_tail(w + j * ldw + full * 16, k - full * 16, control);
    step(xt + full * MR * 16, wv);
  }
  // Back to lane order: lane l sits at position l / 2 (even l) or 8 + l / 2 (odd l).
  const __m512i lanes = _mm512_set_epi32(15, 7, 14, 6, 13, 5, 12, 4, 11, 3, 10, 2, 9, 1, 8, 0);
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_maskz_permutexvar_ps(0xffff, lanes, acc[i][j]);
  lane_tree::store_sums<MR, NR>(acc, y, ldy);
}

// Weight rows [0, NR) of w over every packed x tile; each tile prefetches its share of the next group
// [next, next + next_bytes) into L2. The first tile prefetching all of it (the former way; its loads are the
// ones that miss) ran 0-8 % slower from DRAM (one thread, 1 GiB of weights, 4-16 x rows at k = 768 and 2048,
// variants interleaved in one process); no software prefetch at all was 10-15 % faster at k = 2048 with 12-16
// rows but 25-40 % slower at k = 768. Each tile asking for its share at NR lines a step, the rate it reads
// its own rows, asked for it in the first 1/tiles of its steps, and prefetches that miss hold L1 fill
// buffers the tile's x loads from L2 then wait for; spread over all its steps (PrefetchEvenly), the same
// measurement gave 16 rows at k = 2048 87-92 → 104-113 GFLOP/s, 32 rows 108-120 → 124-136, 8 rows at k = 768
// 78-81 → 84-87. A single tile (m ≤ 6) keeps the fixed rate: evenly spread there is the same addresses, and
// ran 4 % slower.
template <int NR>
void group(const float* xp, int64_t m, int64_t steps, const uint16_t* w, int64_t ldw, int64_t k, float* y,
           int64_t ldy, const char* next, int64_t next_bytes) {
  using TileFn =
      void (*)(const float*, const uint16_t*, int64_t, int64_t, float*, int64_t, const char*, int64_t);
  constexpr auto kTiles = []<bool Evenly, int... R>(std::integer_sequence<int, R...>) {
    return std::array<TileFn, kTileRows + 1>{nullptr, tile<R + 1, NR, Evenly>...};
  };
  constexpr auto kOnlyTile = kTiles.template operator()<false>(std::make_integer_sequence<int, kTileRows>{});
  constexpr auto kSharingTiles =
      kTiles.template operator()<true>(std::make_integer_sequence<int, kTileRows>{});
  const auto& tiles = tile_count(m) == 1 ? kOnlyTile : kSharingTiles;
  const int64_t share = (next_bytes + tile_count(m) - 1) / tile_count(m);
  for (int64_t t = 0; t < tile_count(m); ++t) {
    const int64_t i0 = tile_start(m, t);
    const int64_t at = t * share, bytes = std::clamp<int64_t>(next_bytes - at, 0, share);
    tiles[tile_start(m, t + 1) - i0](xp + i0 * steps * 16, w, ldw, k, y + i0 * ldy, ldy,
                                     bytes > 0 ? next + at : nullptr, bytes);
  }
}

// y[i, n] for i < m (takes_rows(m, k)), n in [n0, n1).
inline void linear_few_rows(const float* x, int64_t ldx, int64_t m, const uint16_t* w, int64_t ldw, int64_t k,
                            int64_t n0, int64_t n1, float* y, int64_t ldy) {
  const int64_t steps = (k + 15) / 16;
  Buffer<float> x_buffer;
  float* const xp = x_buffer.ensure(static_cast<size_t>(m * steps * 16));
  pack_x(x, ldx, m, k, xp);
  const auto row_ptr = [&](int64_t j) { return reinterpret_cast<const char*>(w + j * ldw); };
  const auto bytes_of_rows = [&](int64_t a, int64_t b) { return (b - a) * ldw * int64_t(sizeof(uint16_t)); };
  for (int64_t b = 0; b < bytes_of_rows(n0, std::min(n1, n0 + kGroupRows)); b += 64)
    _mm_prefetch(row_ptr(n0) + b, _MM_HINT_T1);
  int64_t j = n0;
  for (; j + kGroupRows <= n1; j += kGroupRows)
    group<kGroupRows>(xp, m, steps, w + j * ldw, ldw, k, y + j, ldy, row_ptr(j + kGroupRows),
                      bytes_of_rows(j + kGroupRows, std::min(n1, j + 2 * kGroupRows)));
  for (; j < n1; ++j) group<1>(xp, m, steps, w + j * ldw, ldw, k, y + j, ldy, nullptr, 0);
}

}  // namespace xmoe::kernels::avx512::bf16_pairs
