// The register tiles of the `medium` linears' VDPBF16PS arithmetic over bf16 weight rows in memory
// (linear_bf16dot.hpp's order: one 16-lane chain per output over steps of 32 k, then the fixed lane tree),
// shared by the BF16 linear, which reads the checkpoint's rows in place, and the FP8 one, which decodes
// groups of rows into a bf16 panel first (linear_quant_bf16dot_avx512_bf16.cpp). x rows are rounded to bf16
// once into tiles of at most kTileRows rows (5 to 8 rows: one tile) laid out step by step
// ([step][row][32 bf16]), so a tile's x loads are one contiguous stream; each group of weight rows runs
// against every tile while its rows are in L1/L2. Included only by files compiled for AVX512-BF16.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/cpu/bf16dot_lanes_avx512_bf16.hpp"
#include "kernels/cpu/prefetch_slice.hpp"
#include "xmoe/dtype.hpp"

namespace xmoe::kernels::avx512_bf16::bf16dot_tiles {

constexpr int kTileRows = 4;
constexpr int kGroupCols = 6;       // 4 × 6 accumulators + 6 weights + 1 x of the 32 registers
constexpr int64_t kChunkRows = 96;  // x rows per pass over the weights: their bf16 copy stays in L2

inline __mmask32 step_mask(int64_t k, int64_t p) {
  return k - p >= 32 ? __mmask32(0xffffffffu) : __mmask32((1u << (k - p)) - 1);
}

// 5 to 8 rows run as one tile of kWideTileRows × kWideGroupCols: each weight vector loaded feeds all rows,
// where two tiles of 4 × 6 load every weight twice. 9 to 16 rows do so too (two tiles) while a tile's x rows
// stay in L1 beside the group (kWideTileBytes: 16 rows at k = 768, 12 at k = 1024); past that the x rows come
// from L2 and 4 × 6 tiles, which load x half as often per product, were as fast (measured at k = 1024 and
// 2048).
constexpr int kWideTileRows = 8;
constexpr int kWideGroupCols = 3;  // 8 × 3 accumulators + 3 weights + 1 x
constexpr int64_t kWideTileBytes = 12 * 1024;

inline int64_t tile_rows(int64_t m, int64_t steps) {
  const bool wide =
      m <= kWideTileRows || (m <= 2 * kWideTileRows && (m + 1) / 2 * steps * 64 <= kWideTileBytes);
  return m > kTileRows && wide ? kWideTileRows : kTileRows;
}
inline int64_t tile_count(int64_t m, int64_t steps) {
  return (m + tile_rows(m, steps) - 1) / tile_rows(m, steps);
}
// Tiles of nearly equal heights (10 rows in tiles of 4 as 3 + 3 + 4, not 4 + 4 + 2): tile t covers
// [tile_start(t), tile_start(t+1)).
inline int64_t tile_start(int64_t m, int64_t t, int64_t steps) {
  return m * t / tile_count(m, steps);
}

// The tile layout of x rows [0, m): tile t's h rows as [step][row][32] from i0 · steps · 32. pack_row(i, dst,
// step_stride) writes row i's `steps` vectors of 32 bf16, step s at dst + s · step_stride words.
template <class PackRow>
inline void pack_tiles(int64_t m, int64_t steps, uint16_t* out, const PackRow& pack_row) {
  for (int64_t t = 0; t < tile_count(m, steps); ++t) {
    const int64_t i0 = tile_start(m, t, steps), h = tile_start(m, t + 1, steps) - i0;
    for (int64_t i = 0; i < h; ++i) pack_row(i0 + i, out + (i0 * steps + i) * 32, h * 32);
  }
}

// x rows [0, m) rounded to bf16 into tile layout, zeros past k.
inline void pack_x(const float* x, int64_t ldx, int64_t m, int64_t k, uint16_t* out) {
  const int64_t steps = (k + 31) / 32;
  pack_tiles(m, steps, out, [&](int64_t i, uint16_t* dst, int64_t step_stride) {
    const float* row = x + i * ldx;
    for (int64_t s = 0; s < steps; ++s) {
      const int64_t p = s * 32;
      for (int half = 0; half < 2; ++half) {
        const int64_t rem = std::clamp<int64_t>(k - p - 16 * half, 0, 16);
        const __mmask16 mask = rem == 16 ? __mmask16(0xffff) : __mmask16((1u << rem) - 1);
        _mm256_store_si256(reinterpret_cast<__m256i*>(dst + s * step_stride + 16 * half),
                           round_to_bf16(_mm512_maskz_loadu_epi32(mask, row + p + 16 * half)));
      }
    }
  });
}

// Work a group of tiles does between its steps (the default: none). group() calls plan(the steps of all its
// tiles) once, then every tile calls step() at each of its steps: the decoded-panel paths decode the next
// group's weights that way, so the decode's integer work issues beside the tiles' VDPBF16PS instead of
// between groups.
struct NoSideWork {
  void plan(int64_t) {}
  void step() {}
};

// y[i, j] for the MR rows of one packed x tile and NR weight rows read in place; prefetches `next_bytes` of
// `next` into L2, spread over the steps, and runs side->step() at each step.
template <int MR, int NR, bool Share, class Side = NoSideWork>
inline void tile(const uint16_t* xt, const bf16* w, int64_t ldw, int64_t k, float* y, int64_t ldy,
                 const char* next, int64_t next_bytes, Side* side) {
  __m512 acc[MR][NR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
  const int64_t steps = (k + 31) / 32;
  // A group's NR rows a step when one tile prefetches all of them, else this tile's share evenly over its
  // steps.
  constexpr int64_t kStepBytes = NR * 64;
  PrefetchEvenly ahead(next, next_bytes, steps);
  for (int64_t s = 0; s < steps; ++s) {
    const int64_t p = s * 32;
    const __mmask32 mask = step_mask(k, p);
    if constexpr (!std::is_same_v<Side, NoSideWork>) side->step();
    if constexpr (Share)
      ahead.step();
    else if (next_bytes > 0)
      prefetch_slice(next, s * kStepBytes, kStepBytes, next_bytes);
    __m512bh wv[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) wv[j] = (__m512bh)_mm512_maskz_loadu_epi16(mask, w + j * ldw + p);
    const uint16_t* px = xt + s * MR * 32;
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512bh xv = (__m512bh)_mm512_load_si512(px + i * 32);
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], xv, wv[j]);
    }
  }
  lane_tree::store_sums<MR, NR>(acc, y, ldy);
}

template <class Side>
using TileFn = void (*)(const uint16_t*, const bf16*, int64_t, int64_t, float*, int64_t, const char*, int64_t,
                        Side*);
// Tiles above kTileRows rows exist only with kWideGroupCols columns or fewer (32 registers hold the
// accumulators).
template <int MR, int NR, bool Share, class Side>
constexpr TileFn<Side> tile_fn() {
  if constexpr (MR > kTileRows && NR > kWideGroupCols)
    return nullptr;
  else
    return tile<MR, NR, Share, Side>;
}
// The tile function by height (1 to kWideTileRows rows).
template <int NR, bool Share, class Side>
constexpr TileFn<Side> kTileTable[kWideTileRows + 1] = {nullptr,
                                                        tile_fn<1, NR, Share, Side>(),
                                                        tile_fn<2, NR, Share, Side>(),
                                                        tile_fn<3, NR, Share, Side>(),
                                                        tile_fn<4, NR, Share, Side>(),
                                                        tile_fn<5, NR, Share, Side>(),
                                                        tile_fn<6, NR, Share, Side>(),
                                                        tile_fn<7, NR, Share, Side>(),
                                                        tile_fn<8, NR, Share, Side>()};

// Weight rows [j, j + NR) over every packed x tile, which prefetch `next` (see kAhead) between them: with
// several tiles each asks for an equal share of its lines. When the first tile asked for all of them (a
// group is 24 KiB at k = 2048, requested in a quarter of the group's time), m = 16 ran at 146 / 147 GFLOP/s
// per core at k = 2048 / 4096, m = 12 at 135 and m = 32 at 169; shared, 159 / 174, 152 and 182 (one
// thread's CPU time, medians of 4 alternated runs, weights streamed from DRAM). One tile keeps the fixed NR
// lines per step.
// `side`'s work runs between the steps of every tile (NoSideWork: none).
template <int NR, class Side = NoSideWork>
inline void group(const uint16_t* xp, int64_t m, int64_t steps, const bf16* w, int64_t ldw, int64_t k,
                  float* y, int64_t ldy, const char* next, int64_t next_bytes, Side* side = nullptr) {
  const int64_t tiles = tile_count(m, steps);
  if constexpr (!std::is_same_v<Side, NoSideWork>) side->plan(tiles * steps);
  if (tiles == 1) return kTileTable<NR, false, Side>[m](xp, w, ldw, k, y, ldy, next, next_bytes, side);
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t i0 = tile_start(m, t, steps);
    const int64_t lines = (next_bytes + 63) / 64, l0 = lines * t / tiles, l1 = lines * (t + 1) / tiles;
    kTileTable<NR, true, Side>[tile_start(m, t + 1, steps) - i0](
        xp + i0 * steps * 32, w, ldw, k, y + i0 * ldy, ldy, next + l0 * 64,
        std::min(next_bytes, l1 * 64) - l0 * 64, side);
  }
}

}  // namespace xmoe::kernels::avx512_bf16::bf16dot_tiles
