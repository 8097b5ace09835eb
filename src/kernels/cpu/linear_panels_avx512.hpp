// The AVX-512 many-rows linear (prefill) over weights in any format: one panel GEMM for the f32/bf16/f16
// linears (linear_avx512.cpp) and the quantized ones (linear_quant_avx512.cpp), with the weight decoding
// supplied by the caller, so a block-quantized weight is dequantised once per panel into f32 and then runs at
// the same FMA rate as BF16. Include only from files compiled with the AVX-512 flags.
//
// kPanelRows weight rows are decoded into a panel laid out step by step (step s holds the kPanelRows rows'
// 16 elements p = 16s..16s+15, zero past k), and the x rows are copied the same way, tile by tile, so a
// tile's loads are two contiguous streams (rows ldx apart would share L1 sets when ldx is a multiple of 4
// KiB) with no tail masks; every tile of up to kTileRows x rows then runs over the panel in registers. Each
// output is one 16-lane FMA chain over ascending p and the fixed reduction (linear_lanes.hpp), so the results
// are the reference's bit for bit.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <memory>

#include "kernels/cpu/linear_reduce_avx512.hpp"
#include "xmoe/error.hpp"

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

// y[i, j] for the MR rows of one packed x tile and the panel's first NR (≤ kPanelRows) rows.
template <int MR, int NR>
void panel_tile(const float* xt, const float* panel, int64_t steps, float* y, int64_t ldy) {
  __m512 acc[MR][NR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t s = 0; s < steps; ++s) {
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
  // Unrolled like the loops above, so the accumulators stay registers (GCC otherwise keeps the array in
  // memory and stores every accumulator on every step).
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) y[i * ldy + j] = reduce16(acc[i][j]);
}

using PanelTileFn = void (*)(const float* xt, const float* panel, int64_t steps, float* y, int64_t ldy);
// panel_tile<MR, NR> by MR (1..kTileRows).
template <int NR>
constexpr PanelTileFn kPanelTiles[kTileRows + 1] = {nullptr,           panel_tile<1, NR>, panel_tile<2, NR>,
                                                    panel_tile<3, NR>, panel_tile<4, NR>, panel_tile<5, NR>,
                                                    panel_tile<6, NR>};

// The m packed x rows over the panel's first NR rows, tile by tile.
template <int NR>
void panel_rows(const float* xp, int64_t m, const float* panel, int64_t steps, float* y, int64_t ldy) {
  for (int64_t t = 0; t < tile_count(m); ++t) {
    const int64_t i0 = tile_start(m, t);
    kPanelTiles<NR>[tile_start(m, t + 1) - i0](xp + i0 * steps * 16, panel, steps, y + i0 * ldy, ldy);
  }
}

using AlignedFloats = std::unique_ptr<float[], decltype(&std::free)>;
inline AlignedFloats aligned_floats(int64_t count) {
  AlignedFloats p(static_cast<float*>(std::aligned_alloc(64, static_cast<size_t>(count) * sizeof(float))),
                  &std::free);
  XMOE_CHECK(p != nullptr, "linear: out of memory for ", count, " floats of packed operands");
  return p;
}

// y[i, n] for i < m, n in [n0, n1) over weights of k columns that `pack_panel(j, rows, panel)` decodes:
// weight rows [j, j + rows) (rows ≤ kPanelRows) as f32 into the panel's rows 0..rows-1 (row r's step s at
// panel + (s · kPanelRows + r) · 16, zeros past k; rows past `rows` are never read). The packer may prefetch
// the rows after its own; it runs once per panel and chunk of kChunkRows x rows.
template <class PackPanel>
void linear_panels(const float* x, int64_t ldx, int64_t m, int64_t k, int64_t n0, int64_t n1, float* y,
                   int64_t ldy, PackPanel&& pack_panel) {
  using PanelRowsFn = void (*)(const float*, int64_t, const float*, int64_t, float*, int64_t);
  constexpr PanelRowsFn kPanelRowsByCount[kPanelRows + 1] = {nullptr, panel_rows<1>, panel_rows<2>,
                                                             panel_rows<3>, panel_rows<4>};
  const int64_t steps = (k + 15) / 16;
  const AlignedFloats panel = aligned_floats(steps * kPanelRows * 16);
  const AlignedFloats xp = aligned_floats(std::min(m, kChunkRows) * steps * 16);
  for (int64_t c0 = 0; c0 < m; c0 += kChunkRows) {
    const int64_t rows = std::min(kChunkRows, m - c0);
    pack_x(x + c0 * ldx, ldx, rows, k, xp.get());
    for (int64_t j = n0; j < n1; j += kPanelRows) {
      const int count = static_cast<int>(std::min<int64_t>(kPanelRows, n1 - j));
      pack_panel(j, count, panel.get());
      kPanelRowsByCount[count](xp.get(), rows, panel.get(), steps, y + c0 * ldy + j, ldy);
    }
  }
}

}  // namespace xmoe::kernels::avx512::panels
