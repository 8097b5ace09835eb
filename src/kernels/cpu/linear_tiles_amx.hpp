// Tile building blocks the AMX level's `medium` linears share (linear_bf16tile.hpp,
// linear_quant_bf16tile.hpp). The quantized ones decode their weights into bf16 before they are tile
// operands, as A tiles (decode: yᵀ = W · xᵀ, x as B tiles as narrow as its rows) or as B tiles (prefill:
// y = x · Wᵀ, the x rows as A tiles in place). Inline assembly and AVX-512 intrinsics; included only by files
// compiled for AMX.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/cpu/amx_tiles.hpp"

namespace xmoe::kernels::amx {

inline constexpr int64_t kTile = 16;        // outputs or x rows per tile side
inline constexpr int64_t kTileWords = 256;  // one 16 × 64-byte tile in 32-bit words

// v[r] (r = 0..15, 16 dwords each) becomes its transpose: dword c of the new v[r] is dword r of the old v[c].
// (maskz forms: GCC 12 warns that the unmasked ones start from an undefined register.)
inline void transpose16(__m512i v[16]) {
  __m512i a[16], b[16];
  for (int i = 0; i < 16; i += 2) {
    a[i] = _mm512_maskz_unpacklo_epi32(0xffff, v[i], v[i + 1]);
    a[i + 1] = _mm512_maskz_unpackhi_epi32(0xffff, v[i], v[i + 1]);
  }
  // b[4g + j]: rows 4g..4g+3 of column 4L + j in each 128-bit lane L
  for (int g = 0; g < 4; ++g) {
    b[4 * g + 0] = _mm512_maskz_unpacklo_epi64(0xff, a[4 * g], a[4 * g + 2]);
    b[4 * g + 1] = _mm512_maskz_unpackhi_epi64(0xff, a[4 * g], a[4 * g + 2]);
    b[4 * g + 2] = _mm512_maskz_unpacklo_epi64(0xff, a[4 * g + 1], a[4 * g + 3]);
    b[4 * g + 3] = _mm512_maskz_unpackhi_epi64(0xff, a[4 * g + 1], a[4 * g + 3]);
  }
  for (int j = 0; j < 4; ++j) {
    const __m512i lo02 = _mm512_maskz_shuffle_i32x4(0xffff, b[j], b[4 + j], 0x88),
                  lo13 = _mm512_maskz_shuffle_i32x4(0xffff, b[j], b[4 + j], 0xDD);
    const __m512i hi02 = _mm512_maskz_shuffle_i32x4(0xffff, b[8 + j], b[12 + j], 0x88),
                  hi13 = _mm512_maskz_shuffle_i32x4(0xffff, b[8 + j], b[12 + j], 0xDD);
    v[j] = _mm512_maskz_shuffle_i32x4(0xffff, lo02, hi02, 0x88);
    v[8 + j] = _mm512_maskz_shuffle_i32x4(0xffff, lo02, hi02, 0xDD);
    v[4 + j] = _mm512_maskz_shuffle_i32x4(0xffff, lo13, hi13, 0x88);
    v[12 + j] = _mm512_maskz_shuffle_i32x4(0xffff, lo13, hi13, 0xDD);
  }
}

// y[r, n] for the rows [0, rows) and outputs [n, n + cols) of an accumulator tile stored [output][x row],
// `stride` floats per output.
inline void store_transposed(const float* acc, int64_t stride, int64_t rows, int64_t cols, float* y,
                             int64_t ldy) {
  const __m512i outputs =
      _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                         _mm512_set1_epi32(static_cast<int>(stride)));
  const __mmask16 mask = cols == 16 ? __mmask16(0xffff) : __mmask16((1u << cols) - 1);
  for (int64_t r = 0; r < rows; ++r)
    _mm512_mask_storeu_ps(y + r * ldy, mask,
                          _mm512_mask_i32gather_ps(_mm512_setzero_ps(), mask, outputs, acc + r, 4));
}

// y[r, n] for the rows [0, rows) and outputs [n, n + cols) of an accumulator tile stored [x row][output].
inline void store_rows(const float* acc, int64_t rows, int64_t cols, float* y, int64_t ldy) {
  const __mmask16 mask = cols == 16 ? __mmask16(0xffff) : __mmask16((1u << cols) - 1);
  for (int64_t r = 0; r < rows; ++r) _mm512_mask_storeu_ps(y + r * ldy, mask, _mm512_load_ps(acc + r * 16));
}

// Decode shape's tile registers: the accumulator, the two steps' weights (A tiles) and the two steps' x rows
// (B tiles).
inline constexpr int kDecodeC = 0, kDecodeA = 1, kDecodeB = 3;

// Every tile full, or for the decode shape (m x rows, m ≤ 16) the accumulator and x tiles only as wide as the
// rows: a block's x tiles then stay in L1.
inline TileConfig linear_tile_config(bool decode, int64_t m) {
  TileConfig config = full_tiles();
  if (decode)
    for (const int t : {kDecodeC, kDecodeB, kDecodeB + 1}) config.colsb[t] = static_cast<uint16_t>(4 * m);
  return config;
}

// Decode shape: the accumulator += step S's 16 decoded weight rows (`stride` bytes apart) × its x tile (m
// dwords wide).
template <int S>
inline void decode_product(const void* weights, int64_t stride, const uint32_t* x_step, int64_t m) {
  load<kDecodeA + S>(weights, stride);
  load<kDecodeB + S>(x_step, 4 * m);
  dpbf16<kDecodeC, kDecodeA + S, kDecodeB + S>();
}

// Decode shape. x rows [0, m) (m ≤ 16; bf16 words, `steps` · 32 each, ldq apart) as B tiles m dwords wide,
// step s at xb + s · 16 · m words: word [r][i] holds row i's pair r of the step. One row is its own tile:
// xq as it is.
inline const uint32_t* x_tiles(const uint16_t* xq, int64_t ldq, int64_t m, int64_t steps, uint32_t* xb) {
  if (m == 1) return reinterpret_cast<const uint32_t*>(xq);
  const auto mask = static_cast<__mmask16>((1u << m) - 1);
  for (int64_t s = 0; s < steps; ++s) {
    __m512i v[16];
    for (int i = 0; i < 16; ++i)
      v[i] = i < m ? _mm512_load_si512(xq + i * ldq + s * 32) : _mm512_setzero_si512();
    transpose16(v);
    for (int r = 0; r < 16; ++r) _mm512_mask_storeu_epi32(xb + (s * 16 + r) * m, mask, v[r]);
  }
  return xb;
}

// NA A tiles (16 rows each: tile i's step s at a[i] + 64 · s bytes, rows a_stride[i] bytes apart) × NB packed
// B tiles (tile j's step s at b + (j · steps + s) · 256 words) over all steps; accumulator (i, j) to
// acc + (i · NB + j) · 256, rows of the A tile by columns of the B tile.
template <int NA, int NB>
inline void tile_block(const std::byte* const* a, const int64_t* a_stride, const uint32_t* b, int64_t steps,
                       float* acc) {
  constexpr int kA = NA * NB, kB = NA * NB + NA;
  static_assert(kB + NB <= 8, "eight tile registers");
  static_for<NA * NB>([](auto c) { zero<decltype(c)::value>(); });
  for (int64_t s = 0; s < steps; ++s) {
    static_for<NB>([&](auto j) { load<kB + decltype(j)::value>(b + (j * steps + s) * kTileWords, 64); });
    static_for<NA>([&](auto i) {
      constexpr int I = decltype(i)::value;
      load<kA + I>(a[I] + s * 64, a_stride[I]);
      static_for<NB>([&](auto j) {
        constexpr int J = decltype(j)::value;
        dpbf16<I * NB + J, kA + I, kB + J>();
      });
    });
  }
  static_for<NA * NB>([&](auto c) { store<decltype(c)::value>(acc + decltype(c)::value * kTileWords, 64); });
}

// Prefill shape: MT x-row tiles at xq (rows ldq words apart, 16 per tile) × NT output tiles of the panel.
template <int MT, int NT>
inline void x_panel_block(const uint16_t* xq, int64_t ldq, const uint32_t* panel, int64_t steps, float* acc) {
  const std::byte* a[MT];
  int64_t stride[MT];
  for (int i = 0; i < MT; ++i) {
    a[i] = reinterpret_cast<const std::byte*>(xq + i * kTile * ldq);
    stride[i] = ldq * 2;
  }
  tile_block<MT, NT>(a, stride, panel, steps, acc);
}

// Prefill shape: y rows [0, h) (h ≤ 32, the x rows at xq, ldq words apart; rows h..16 · ⌈h / 16⌉ readable),
// outputs [s0, s1) (the panel's B tiles, 16 outputs and `steps` · 256 words each); 2 × 2 accumulator tiles
// where the rows and outputs fill them. `acc`: 4 tiles.
inline void panel_rows(const uint16_t* xq, int64_t ldq, const uint32_t* panel, int64_t steps, int64_t s0,
                       int64_t s1, int64_t h, float* y, int64_t ldy, float* acc) {
  const int64_t groups = (s1 - s0 + kTile - 1) / kTile, mt = (h + kTile - 1) / kTile;
  for (int64_t g = 0; g < groups; g += 2) {
    const int64_t nt = std::min<int64_t>(2, groups - g);
    const uint32_t* p = panel + g * steps * kTileWords;
    if (mt == 2 && nt == 2)
      x_panel_block<2, 2>(xq, ldq, p, steps, acc);
    else if (mt == 2)
      x_panel_block<2, 1>(xq, ldq, p, steps, acc);
    else if (nt == 2)
      x_panel_block<1, 2>(xq, ldq, p, steps, acc);
    else
      x_panel_block<1, 1>(xq, ldq, p, steps, acc);
    for (int64_t i = 0; i < mt; ++i)
      for (int64_t j = 0; j < nt; ++j) {
        const int64_t n = s0 + (g + j) * kTile;
        store_rows(acc + (i * nt + j) * kTileWords, std::min(kTile, h - i * kTile), std::min(kTile, s1 - n),
                   y + i * kTile * ldy + n, ldy);
      }
  }
}

}  // namespace xmoe::kernels::amx
