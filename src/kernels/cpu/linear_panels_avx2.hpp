// The AVX2 many-rows linear (prefill) over weights in any format: one panel GEMM for the f32/bf16/f16 linears
// (linear_avx2.cpp) and the quantized ones (linear_quant_avx2.cpp), with the weight decoding supplied by the
// caller, so a block-quantized weight is dequantised once per panel into f32 and then runs at the same
// FMA rate as BF16. Include only from files compiled with the AVX2 flags.
//
// kPanelRows weight rows are decoded into a panel laid out step by step (step s holds the rows' 16 elements
// p = 16s..16s+15, zero past k) and every tile of up to kTileRows x rows runs over it in registers. The 16
// lanes of the shared summation order (linear_lanes.hpp) are two 8-float registers; each output is one FMA
// chain per lane over ascending p and the fixed reduction, so the results are the reference's bit for bit.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <memory>

#include "kernels/cpu/linear_lanes.hpp"
#include "xmoe/error.hpp"

namespace xmoe::kernels::avx2::panels {

constexpr int kPanelRows = 2;
constexpr int kTileRows = 3;  // 3 × 2 outputs × 2 halves = 12 accumulators + 2 weights + 1 x of 16 registers

// y[i, j] = the fixed reduction (linear_lanes.hpp) of the 16 lanes acc[0][i][j] (lanes 0–7) and acc[1][i][j]
// (lanes 8–15).
template <int MR, int NR>
inline void store_reduced(const __m256 (&acc)[2][MR][NR], float* y, int64_t ldy) {
  alignas(32) float lanes[16];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) {
      _mm256_store_ps(lanes, acc[0][i][j]);
      _mm256_store_ps(lanes + 8, acc[1][i][j]);
      y[i * ldy + j] = reduce_lanes(lanes);
    }
}

template <int MR, int NR>
void panel_tile(const float* x, int64_t ldx, const float* panel, int64_t k, float* y, int64_t ldy) {
  __m256 acc[2][MR][NR];
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h)
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
      for (int j = 0; j < NR; ++j) acc[h][i][j] = _mm256_setzero_ps();
  const float* pw = panel;
  for (int64_t p = 0; p < k; p += 16, pw += kPanelRows * 16) {
    // Lanes past k load as zeros (their weights are zeros too).
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i left = _mm256_set1_epi32(static_cast<int>(std::min<int64_t>(16, k - p)));
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const __m256i mask = _mm256_cmpgt_epi32(left, _mm256_add_epi32(lane, _mm256_set1_epi32(8 * h)));
      __m256 wv[NR];
#pragma GCC unroll 4
      for (int j = 0; j < NR; ++j) wv[j] = _mm256_load_ps(pw + j * 16 + 8 * h);
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i) {
        const __m256 xv = _mm256_maskload_ps(x + i * ldx + p + 8 * h, mask);
#pragma GCC unroll 4
        for (int j = 0; j < NR; ++j) acc[h][i][j] = _mm256_fmadd_ps(xv, wv[j], acc[h][i][j]);
      }
    }
  }
  store_reduced<MR, NR>(acc, y, ldy);
}

using PanelTileFn = void (*)(const float* x, int64_t ldx, const float* panel, int64_t k, float* y,
                             int64_t ldy);
// panel_tile<MR, NR> by MR (1..kTileRows).
template <int NR>
constexpr PanelTileFn kPanelTiles[kTileRows + 1] = {nullptr, panel_tile<1, NR>, panel_tile<2, NR>,
                                                    panel_tile<3, NR>};

// The m rows in tiles of at most kTileRows, of nearly equal heights.
template <int NR>
void panel_rows(const float* x, int64_t ldx, int64_t m, const float* panel, int64_t k, float* y,
                int64_t ldy) {
  const int64_t tiles = (m + kTileRows - 1) / kTileRows;
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t i0 = m * t / tiles, rows = m * (t + 1) / tiles - i0;
    kPanelTiles<NR>[rows](x + i0 * ldx, ldx, panel, k, y + i0 * ldy, ldy);
  }
}

// y[i, n] for i < m, n in [n0, n1) over weights of k columns that `pack_panel(j, rows, panel)` decodes:
// weight rows [j, j + rows) (rows ≤ kPanelRows) as f32 into the panel's rows 0..rows-1 (row r's step s at
// panel + (s · kPanelRows + r) · 16, 32-byte aligned, zeros past k; rows past `rows` are never read).
template <class PackPanel>
void linear_panels(const float* x, int64_t ldx, int64_t m, int64_t k, int64_t n0, int64_t n1, float* y,
                   int64_t ldy, PackPanel&& pack_panel) {
  const size_t floats = static_cast<size_t>((k + 15) / 16 * kPanelRows * 16);
  auto panel = std::unique_ptr<float[], decltype(&std::free)>(
      static_cast<float*>(std::aligned_alloc(32, floats * sizeof(float))), &std::free);
  XMOE_CHECK(panel != nullptr, "linear: out of memory for a ", kPanelRows, " x ", k, " weight panel");
  for (int64_t j = n0; j < n1; j += kPanelRows) {
    const int rows = static_cast<int>(std::min<int64_t>(kPanelRows, n1 - j));
    pack_panel(j, rows, panel.get());
    if (rows == kPanelRows) {
      panel_rows<kPanelRows>(x, ldx, m, panel.get(), k, y + j, ldy);
    } else {
      panel_rows<1>(x, ldx, m, panel.get(), k, y + j, ldy);
    }
  }
}

}  // namespace xmoe::kernels::avx2::panels
