// The AVX2 many-rows linear (prefill) over weights in any format: one panel GEMM for the f32/bf16/f16 linears
// (linear_avx2.cpp) and the quantized ones (linear_quant_avx2.cpp), with the weight decoding supplied by the
// caller, so a block-quantized weight is dequantised once per panel into f32 and then runs at the same
// FMA rate as BF16. Include only from files compiled with the AVX2 flags.
//
// As the AVX-512 variant (linear_panels_avx512.hpp): kPanelRows weight rows are decoded into a panel, the x
// rows are copied tile by tile, kChunkRows at a time, and every tile of up to kPanelTileRows x rows runs over
// the panel in registers. The 16 lanes of the shared summation order (linear_lanes.hpp) are two 8-float
// registers, and both copies are laid out half by half (all steps' lanes 0-7, then all steps' lanes 8-15;
// step s holds the elements p = 16s..16s+15, zero past k), so a tile runs lanes 0-7 over every step, then
// lanes 8-15: each output is still one FMA chain per lane over ascending p and the fixed reduction, the
// reference's bits, but a pass needs one register per output instead of two, and 4 x rows × 3 weight rows
// fit the 16 registers where two halves allowed 3 × 2. That is 7 loads per 12 FMAs instead of 10, and a
// third less of the x traffic from L2 that bound the old tile. The x rows used to be read in place, each
// panel streaming all m of them from memory (4 MiB at 512 × 2048) with a computed mask on every load: on
// Sapphire Rapids capped at AVX2 a 512-token prefill of the 8-layer Qwen3-30B-A3B shape ran at 27 % of the
// AVX2 FMA peak, 56 % with the copies and the 3 × 2 tile.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/prefetch_slice.hpp"
#include "util/buffer.hpp"

namespace xmoe::kernels::avx2::panels {

constexpr int kPanelRows = 3;
constexpr int kPanelTileRows = 4;  // 4 × 3 outputs = 12 accumulators + 3 weights + 1 x of 16 registers
// x rows per pass over the weights: their packed copy (192 KiB at k = 1024, 384 KiB at 2048) stays in a Zen 3
// core's 512 KiB L2 while the panels go by.
constexpr int64_t kChunkRows = 48;

// reduce_lanes (linear_lanes.hpp) in registers: halves (l + 8), then l + 4, l + 2, l + 1 — the same
// additions, so the same bits, in 7 instructions instead of two stores and 15 dependent scalar adds.
inline float reduce16(__m256 lo, __m256 hi) {
  const __m256 s8 = _mm256_add_ps(lo, hi);
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  const __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
  return _mm_cvtss_f32(s1);
}

// y[i, j] = the fixed reduction of the 16 lanes acc[0][i][j] (lanes 0–7) and acc[1][i][j] (lanes 8–15).
template <int MR, int NR>
inline void store_reduced(const __m256 (&acc)[2][MR][NR], float* y, int64_t ldy) {
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) y[i * ldy + j] = reduce16(acc[0][i][j], acc[1][i][j]);
}

// How m rows split into tiles of at most `most` rows, of nearly equal heights: tile t covers rows
// [tile_start(m, t), tile_start(m, t + 1)).
inline int64_t tile_count(int64_t m, int64_t most = kPanelTileRows) {
  return (m + most - 1) / most;
}
inline int64_t tile_start(int64_t m, int64_t t, int64_t most = kPanelTileRows) {
  return m * t / tile_count(m, most);
}

// The panel GEMM's copy of x rows [0, m): tiles of up to kPanelTileRows rows (tile_start), tile t's rows
// i0..i0+h-1 from i0 · steps · 16 as [half][step][row][8], zeros past k.
inline void pack_x_halves(const float* x, int64_t ldx, int64_t m, int64_t k, float* out) {
  const int64_t steps = (k + 15) / 16;
  for (int64_t t = 0; t < tile_count(m); ++t) {
    const int64_t i0 = tile_start(m, t), h = tile_start(m, t + 1) - i0;
    float* tile = out + i0 * steps * 16;
    for (int64_t i = 0; i < h; ++i)
      for (int64_t s = 0; s < steps; ++s) {
        float step[16] = {};
        std::memcpy(step, x + (i0 + i) * ldx + s * 16,
                    static_cast<size_t>(std::min<int64_t>(16, k - s * 16)) * sizeof(float));
        std::memcpy(tile + (s * h + i) * 8, step, 8 * sizeof(float));
        std::memcpy(tile + ((steps + s) * h + i) * 8, step + 8, 8 * sizeof(float));
      }
  }
}

// Where a packer puts weight row r's step s (lanes 0-7 in lo, 8-15 in hi) in a panel of `steps` steps.
inline void store_panel_step(float* panel, int64_t steps, int64_t s, int r, __m256 lo, __m256 hi) {
  _mm256_store_ps(panel + (s * kPanelRows + r) * 8, lo);
  _mm256_store_ps(panel + ((steps + s) * kPanelRows + r) * 8, hi);
}

// y[i, j] for the MR rows of one packed x tile and the panel's first NR (≤ kPanelRows) rows: lanes 0-7 over
// every step, then lanes 8-15, then the fixed reduction.
template <int MR, int NR>
void panel_tile(const float* xt, const float* panel, int64_t steps, float* y, int64_t ldy) {
  __m256 acc[2][MR][NR];
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h) {
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
      for (int j = 0; j < NR; ++j) acc[h][i][j] = _mm256_setzero_ps();
    const float* pw = panel + h * steps * kPanelRows * 8;
    const float* px = xt + h * steps * MR * 8;
    for (int64_t s = 0; s < steps; ++s, pw += kPanelRows * 8, px += MR * 8) {
      __m256 wv[NR];
#pragma GCC unroll 4
      for (int j = 0; j < NR; ++j) wv[j] = _mm256_load_ps(pw + j * 8);
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i) {
        __m256 xv = _mm256_load_ps(px + i * 8);
        asm("" : "+x"(xv));  // one load per x vector: GCC would fold it into each of the NR FMAs
#pragma GCC unroll 4
        for (int j = 0; j < NR; ++j) acc[h][i][j] = _mm256_fmadd_ps(xv, wv[j], acc[h][i][j]);
      }
    }
  }
  store_reduced<MR, NR>(acc, y, ldy);
}

using PanelTileFn = void (*)(const float* xt, const float* panel, int64_t steps, float* y, int64_t ldy);
// panel_tile<MR, NR> by MR (1..kPanelTileRows).
template <int NR>
constexpr PanelTileFn kPanelTiles[kPanelTileRows + 1] = {nullptr, panel_tile<1, NR>, panel_tile<2, NR>,
                                                         panel_tile<3, NR>, panel_tile<4, NR>};

// The m packed x rows over the panel's `count` rows, tile by tile. Before each tile it asks for its share of
// the lines of `ahead` (the next panel's weights, when the packer names them).
inline void panel_rows(const float* xp, int64_t m, const float* panel, int count, int64_t steps, float* y,
                       int64_t ldy, WeightSpan ahead) {
  constexpr PanelTileFn const* kByRows[kPanelRows + 1] = {nullptr, kPanelTiles<1>, kPanelTiles<2>,
                                                          kPanelTiles<3>};
  const int64_t tiles = tile_count(m);
  PrefetchEvenly prefetch(ahead.data, ahead.bytes, tiles);
  for (int64_t t = 0; t < tiles; ++t) {
    prefetch.step();
    const int64_t i0 = tile_start(m, t), h = tile_start(m, t + 1) - i0;
    kByRows[count][h](xp + i0 * steps * 16, panel, steps, y + i0 * ldy, ldy);
  }
}

// y[i, n] for i < m, n in [n0, n1) over weights of k columns that `pack_panel(j, rows, panel)` decodes:
// weight rows [j, j + rows) (rows ≤ kPanelRows) as f32 into the panel's rows 0..rows-1 (store_panel_step:
// half by half, 32-byte aligned, zeros past k; rows past `rows` are never read). It runs once per panel and
// chunk of kChunkRows x rows. A packer whose rows are one span of memory names it
// (`pack_panel.span(j, rows)`, a WeightSpan), and the tiles over the panel before prefetch it.
template <class PackPanel>
void linear_panels(const float* x, int64_t ldx, int64_t m, int64_t k, int64_t n0, int64_t n1, float* y,
                   int64_t ldy, PackPanel&& pack_panel) {
  const int64_t steps = (k + 15) / 16;
  Buffer<float> panel_buffer, x_buffer;
  float* const panel = panel_buffer.ensure(static_cast<size_t>(steps * kPanelRows * 16));
  float* const xp = x_buffer.ensure(static_cast<size_t>(std::min(m, kChunkRows) * steps * 16));
  for (int64_t c0 = 0; c0 < m; c0 += kChunkRows) {
    const int64_t rows = std::min(kChunkRows, m - c0);
    pack_x_halves(x + c0 * ldx, ldx, rows, k, xp);
    for (int64_t j = n0; j < n1; j += kPanelRows) {
      const int count = static_cast<int>(std::min<int64_t>(kPanelRows, n1 - j));
      pack_panel(j, count, panel);
      const WeightSpan ahead = next_panel_span(pack_panel, j, kPanelRows, n0, n1, c0 + kChunkRows < m);
      panel_rows(xp, rows, panel, count, steps, y + c0 * ldy + j, ldy, ahead);
    }
  }
}

}  // namespace xmoe::kernels::avx2::panels
