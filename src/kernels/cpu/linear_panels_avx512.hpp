// The AVX-512 many-rows linear (prefill) over weights in any format: one panel GEMM for the f32/bf16/f16
// linears (linear_avx512.cpp) and the quantized ones (linear_quant_avx512.cpp), with the weight decoding
// supplied by the caller, so a block-quantized weight is dequantised once per panel into f32 and then runs at
// the same FMA rate as BF16. Include only from files compiled with the AVX-512 flags.
//
// kPanelRows weight rows are decoded into a panel laid out step by step (step s holds the kPanelRows rows'
// 16 elements p = 16s..16s+15, zero past k), and the x rows are copied the same way, tile by tile, so a
// tile's loads are two contiguous streams (rows ldx apart would share L1 sets when ldx is a multiple of 4
// KiB) with no tail masks; every tile of up to kTileRows x rows then runs over the panel in registers, one
// L1-sized k block after another. Each output is one 16-lane FMA chain over ascending p and the fixed
// reduction (linear_lanes.hpp), so the results are the reference's bit for bit.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/linear_reduce_avx512.hpp"
#include "kernels/cpu/prefetch_slice.hpp"
#include "util/buffer.hpp"

namespace xmoe::kernels::avx512::panels {

constexpr int kPanelRows = 4;
constexpr int kTileRows = 6;        // 6 × 4 accumulators + 4 weights + 1 x: 29 of the 32 registers
constexpr int64_t kChunkRows = 96;  // x rows per pass over the weights: their copy stays in L2

inline __mmask16 step_mask(int64_t k, int64_t p) {
  return k - p >= 16 ? __mmask16(0xffff) : __mmask16((1u << (k - p)) - 1);
}

using lane_tree::reduce16;

// How m rows split into tiles of at most kTileRows, of nearly equal heights (8 rows as 4 + 4, not 6 + 2: a
// short tile reloads the panel for few FMAs): tile t covers rows [tile_start(m, t), tile_start(m, t + 1)).
inline int64_t tile_count(int64_t m, int64_t most = kTileRows) {
  return (m + most - 1) / most;
}
inline int64_t tile_start(int64_t m, int64_t t, int64_t most = kTileRows) {
  return m * t / tile_count(m, most);
}

// Copies x rows [0, m) into tile layout (tiles of at most `most` rows): tile t's rows i0..i1 as
// [step][row][16] starting at i0 · steps · 16.
inline void pack_x(const float* x, int64_t ldx, int64_t m, int64_t k, float* out, int64_t most = kTileRows) {
  const int64_t steps = (k + 15) / 16;
  for (int64_t t = 0; t < tile_count(m, most); ++t) {
    const int64_t i0 = tile_start(m, t, most), h = tile_start(m, t + 1, most) - i0;
    float* tile = out + i0 * steps * 16;
    for (int64_t i = 0; i < h; ++i) {
      const float* row = x + (i0 + i) * ldx;
      for (int64_t s = 0; s < steps; ++s)
        _mm512_store_ps(tile + (s * h + i) * 16, _mm512_maskz_loadu_ps(step_mask(k, s * 16), row + s * 16));
    }
  }
}

// y[i, j] for the MR rows of one packed x tile and the panel's first NR (≤ kPanelRows) rows, over the steps
// [s0, s1) of a k block: the first block starts the accumulators at zero, a later one from `partial` (MR · NR
// vectors), where a block that is not the last leaves them; the last reduces them into y. A chain continued
// from memory is the same chain (same additions, same order), so the bits do not depend on the blocking.
template <int MR, int NR>
void panel_tile(const float* xt, const float* panel, int64_t s0, int64_t s1, bool first, bool last,
                __m512* partial, float* y, int64_t ldy) {
  __m512 acc[MR][NR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) acc[i][j] = first ? _mm512_setzero_ps() : partial[i * NR + j];
  for (int64_t s = s0; s < s1; ++s) {
    const float* pw = panel + s * kPanelRows * 16;
    const float* px = xt + s * MR * 16;
    __m512 wv[NR];
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) wv[j] = _mm512_load_ps(pw + j * 16);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512 xv = _mm512_load_ps(px + i * 16);
#pragma GCC unroll 4
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
  if (last) {
    // All the tile's outputs reduced together (about 3 instructions each instead of reduce16's 11).
    lane_tree::store_sums<MR, NR>(acc, y, ldy);
    return;
  }
  // Unrolled like the loops above, so the accumulators stay registers.
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) partial[i * NR + j] = acc[i][j];
}

using PanelTileFn = void (*)(const float* xt, const float* panel, int64_t s0, int64_t s1, bool first,
                             bool last, __m512* partial, float* y, int64_t ldy);
// panel_tile<MR, NR> by MR (1..kTileRows).
template <int NR>
constexpr PanelTileFn kPanelTiles[kTileRows + 1] = {nullptr,           panel_tile<1, NR>, panel_tile<2, NR>,
                                                    panel_tile<3, NR>, panel_tile<4, NR>, panel_tile<5, NR>,
                                                    panel_tile<6, NR>};

// Steps per k block. Over the whole of k (2048 f32 = 8 KiB a row), a tile's 6 x rows and the panel's 4 rows
// (80 KiB) pass through L1 between two uses of a panel line, so every tile read the panel from L2 as well as
// its x rows; a block's 10 rows × 48 steps (30 KiB) stay within the smallest AVX-512 L1 (32 KiB), and the
// panel's block is read from L1 by every tile after the first. Each tile then stores and reloads its
// accumulators once per block. One thread on Sapphire Rapids (`xmoe linear-bench --threads 1 --clock thread
// --isa avx512_bf16 --rows 32,512`, bf16, k = 2048): 32 rows 98–104 → 106–110 GFLOP/s, 512 rows 125–131 →
// 135–139; in a scratch loop blocks of 48 or 64 steps did equally, 32 worse.
constexpr int64_t kBlockSteps = 48;

// The m packed x rows over the panel's first NR rows, k block by k block, tile by tile; `partials` holds
// kTileRows · kPanelRows vectors for each tile. Between tiles it asks for the lines of `ahead` (the next
// panel's weights, when the packer names them) evenly over its tiles.
template <int NR>
void panel_rows(const float* xp, int64_t m, const float* panel, int64_t steps, __m512* partials, float* y,
                int64_t ldy, WeightSpan ahead) {
  const int64_t blocks = (steps + kBlockSteps - 1) / kBlockSteps;
  PrefetchEvenly prefetch(ahead.data, ahead.bytes, blocks * tile_count(m));
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t s0 = steps * b / blocks, s1 = steps * (b + 1) / blocks;
    for (int64_t t = 0; t < tile_count(m); ++t) {
      prefetch.step();
      const int64_t i0 = tile_start(m, t);
      kPanelTiles<NR>[tile_start(m, t + 1) - i0](xp + i0 * steps * 16, panel, s0, s1, b == 0, b + 1 == blocks,
                                                 partials + t * kTileRows * kPanelRows, y + i0 * ldy, ldy);
    }
  }
}

// y[i, n] for i < m, n in [n0, n1) over weights of k columns that `pack_panel(j, rows, panel)` decodes:
// weight rows [j, j + rows) (rows ≤ kPanelRows) as f32 into the panel's rows 0..rows-1 (row r's step s at
// panel + (s · kPanelRows + r) · 16, zeros past k; rows past `rows` are never read). It runs once per panel
// and chunk of kChunkRows x rows. A packer whose rows are one span of memory names it (`pack_panel.span(j,
// rows)`, a WeightSpan), and the tiles over the panel before prefetch it evenly (every packer here does: a
// prefetch issued while decoding came as a burst that held the L1 fill buffers the decoding's loads need).
template <class PackPanel>
void linear_panels(const float* x, int64_t ldx, int64_t m, int64_t k, int64_t n0, int64_t n1, float* y,
                   int64_t ldy, PackPanel&& pack_panel) {
  using PanelRowsFn =
      void (*)(const float*, int64_t, const float*, int64_t, __m512*, float*, int64_t, WeightSpan);
  constexpr PanelRowsFn kPanelRowsByCount[kPanelRows + 1] = {nullptr, panel_rows<1>, panel_rows<2>,
                                                             panel_rows<3>, panel_rows<4>};
  const int64_t steps = (k + 15) / 16;
  Buffer<float> panel_buffer, x_buffer, partial_buffer;
  float* const panel = panel_buffer.ensure(static_cast<size_t>(steps * kPanelRows * 16));
  float* const xp = x_buffer.ensure(static_cast<size_t>(std::min(m, kChunkRows) * steps * 16));
  __m512* const partials = reinterpret_cast<__m512*>(partial_buffer.ensure(
      static_cast<size_t>(tile_count(std::min(m, kChunkRows)) * kTileRows * kPanelRows * 16)));
  for (int64_t c0 = 0; c0 < m; c0 += kChunkRows) {
    const int64_t rows = std::min(kChunkRows, m - c0);
    pack_x(x + c0 * ldx, ldx, rows, k, xp);
    for (int64_t j = n0; j < n1; j += kPanelRows) {
      const int count = static_cast<int>(std::min<int64_t>(kPanelRows, n1 - j));
      pack_panel(j, count, panel);
      const WeightSpan ahead = next_panel_span(pack_panel, j, kPanelRows, n0, n1, c0 + kChunkRows < m);
      kPanelRowsByCount[count](xp, rows, panel, steps, partials, y + c0 * ldy + j, ldy, ahead);
    }
  }
}

}  // namespace xmoe::kernels::avx512::panels
