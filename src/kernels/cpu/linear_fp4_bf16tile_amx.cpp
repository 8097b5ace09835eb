// The AMX level's `medium` linears for MXFP4 and NVFP4 weights (linear_quant_bf16tile.hpp's arithmetic, bit
// for bit the scalar references' for every m, column block and thread). Each 16 weight rows are decoded
// whole into bf16 with their block scales (MXFP4: fp4_codes_avx512_bf16.hpp's exponent change; NVFP4: the
// E2M1 value times the E4M3 scale in f32, exact, then to bf16), rows padded by a line so a tile's 16 rows do
// not share an L1 set; the activations are rounded to bf16 once per call, in the FP4 chunk order.
//  * Up to kDecodeRows x rows: yᵀ = W · xᵀ, the decoded rows as A tiles (two alternating buffers, so the
//    next rows are decoded while the last tile's products run) against x tiles as narrow as the rows.
//  * More rows: y = x · Wᵀ, 128 weight rows at a time decoded and transposed into B tiles, the packed x rows
//    as A tiles: 2 × 2 tiles over 32 x rows × 32 outputs.
// (maskz intrinsic forms: GCC 12 warns that the unmasked ones start from an undefined register.)
// NVFP4's global scale multiplies each output once. MXFP4 scale codes outside 2..252 (which the exponent
// change does not reproduce) send their tile or block to the reference.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/amx_tiles.hpp"
#include "kernels/cpu/fp4_codes_avx512_bf16.hpp"
#include "kernels/cpu/linear_bf16tile.hpp"
#include "kernels/cpu/linear_quant.hpp"
#include "kernels/cpu/linear_quant_bf16dot.hpp"
#include "kernels/cpu/linear_quant_bf16tile.hpp"
#include "kernels/cpu/quant_tiles_amx.hpp"
#include "util/buffer.hpp"

namespace xmoe::kernels::amx {
namespace {

constexpr int64_t kDecodeRows = kFp4TileDecodeRows;
// decode: tile registers of the accumulator, the two parities' weights and the two parities' x rows
constexpr int kDecodeC = 0, kDecodeA = 1, kDecodeB = 3;
constexpr int64_t kRowGroup = 32;    // prefill: x rows per group of A tiles
constexpr int64_t kPanelRows = 128;  // prefill: weight rows decoded at a time

template <bool NV>
struct Fp4TileCall {
  const LinearArgs& a;
  int64_t k, padded, steps;
  int64_t ld;                   // words between rows of the packed x and of the decoded weights
  float post;                   // NVFP4's global scale; 1 for MXFP4
  LinearFn fallback;            // the scalar reference of the format
  alignas(64) float e4m3[256];  // NVFP4: each scale code's E4M3 value

  explicit Fp4TileCall(const LinearArgs& args)
      : a(args),
        k(args.w->cols),
        padded((k + kFp4Bf16DotChunk - 1) / kFp4Bf16DotChunk * kFp4Bf16DotChunk),
        steps(padded / kBf16TileStep),
        ld(padded + 32),
        post(NV ? args.w->global_scale : 1.0f),
        fallback(NV ? reference::linear_nvfp4_medium_tile : reference::linear_mxfp4_medium_tile) {
    if constexpr (NV) {
      PackedWeight unit = *args.w;  // the table of the block multipliers without the global scale
      unit.global_scale = 1.0f;
      quant::fill_scale_table(unit, e4m3);
    }
  }

  // NVFP4 rows [n, n + rows) as bf16 weights (E2M1 value · E4M3 scale) in chunk order, row j at panel + j ·
  // ld; zeros past k. Word w of a step belongs to the chunk's scale block w / 4.
  void nvfp4_decode_rows(int64_t n, int64_t rows, uint16_t* panel) const {
    const PackedWeight& w = *a.w;
    const __m512i table = avx512_bf16::e2m1_bf16_table();
    const __m512i lo_blocks = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    const __m512i hi_blocks = _mm512_add_epi32(lo_blocks, _mm512_set1_epi32(4));
    alignas(64) uint16_t first[32];  // step 0's element of each word
    for (int word = 0; word < 32; ++word)
      first[word] = static_cast<uint16_t>(8 * (word / 2) + 4 * (word % 2));
    const __m512i elements = _mm512_load_si512(first);
    for (int64_t j = 0; j < rows; ++j) {
      const auto* row = reinterpret_cast<const uint8_t*>(w.data) + (n + j) * w.row_bytes;
      const auto* codes = reinterpret_cast<const uint8_t*>(w.scales) + (n + j) * w.scale_row_stride;
      uint16_t* out = panel + j * ld;
      for (int64_t c = 0; c < padded; c += kFp4Bf16DotChunk) {
        const int64_t left = k - c;
        const __m512i raw =
            left >= 128 ? _mm512_loadu_si512(row + c / 2)
                        : _mm512_maskz_loadu_epi8(avx512_bf16::byte_mask((left + 1) / 2), row + c / 2);
        const int64_t blocks = std::min<int64_t>(8, (left + 15) / 16);
        const __mmask16 live = static_cast<__mmask16>((1u << blocks) - 1);
        const __m512i index = _mm512_maskz_cvtepu8_epi32(0xffff, _mm_maskz_loadu_epi8(live, codes + c / 16));
        const __m512 scale = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), live, index, e4m3, 4);
        const __m512 lo_scale = _mm512_maskz_permutexvar_ps(0xffff, lo_blocks, scale),
                     hi_scale = _mm512_maskz_permutexvar_ps(0xffff, hi_blocks, scale);
        for (int s = 0; s < 4; ++s) {
          const __m512i nibbles = s == 0 ? raw : _mm512_srli_epi16(raw, static_cast<unsigned>(4 * s));
          const __m512i words = _mm512_permutexvar_epi16(nibbles, table);
          const __m512 lo = _mm512_castsi512_ps(_mm512_maskz_slli_epi32(
              0xffff, _mm512_maskz_cvtepu16_epi32(0xffff, _mm512_maskz_extracti64x4_epi64(0xf, words, 0)),
              16));
          const __m512 hi = _mm512_castsi512_ps(_mm512_maskz_slli_epi32(
              0xffff, _mm512_maskz_cvtepu16_epi32(0xffff, _mm512_maskz_extracti64x4_epi64(0xf, words, 1)),
              16));
          __m512i v = (__m512i)_mm512_cvtne2ps_pbh(_mm512_mul_ps(hi, hi_scale), _mm512_mul_ps(lo, lo_scale));
          if (left < 128)  // zeros past k (a NaN scale times a padding code is no zero)
            v = _mm512_maskz_mov_epi16(
                _mm512_cmplt_epu16_mask(_mm512_add_epi16(elements, _mm512_set1_epi16(static_cast<short>(s))),
                                        _mm512_set1_epi16(static_cast<short>(left))),
                v);
          _mm512_store_si512(out + c + 32 * s, v);
        }
      }
    }
  }

  // Rows [n, n + rows) decoded at panel + j · ld; false where a code is left to the reference.
  bool decode(int64_t n, int64_t rows, uint16_t* panel) const {
    if constexpr (NV) {
      nvfp4_decode_rows(n, rows, panel);
      return true;
    } else {
      return avx512_bf16::mxfp4_decode_rows(*a.w, n, rows, panel, ld);
    }
  }

  // Decode shape: every 16 weight rows against the x B tiles (tile registers as the caller configured them).
  void decode_shape(const uint32_t* xb, uint16_t* panels, float* acc) const {
    for (int64_t n = a.n0, t = 0; n < a.n1; n += kTile, ++t) {
      const int64_t rows = std::min(kTile, a.n1 - n);
      uint16_t* p = panels + (t & 1) * kTile * ld;
      if (!decode(n, rows, p)) {
        quant::reference_part(a, fallback, 0, a.m, n, rows);
        continue;
      }
      zero<kDecodeC>();
      for (int64_t s = 0; s < steps; s += 2)
        static_for<2>([&](auto parity) {
          constexpr int S = decltype(parity)::value;
          load<kDecodeA + S>(p + (s + S) * 32, ld * 2);
          load<kDecodeB + S>(xb + (s + S) * 16 * a.m, 4 * a.m);
          dpbf16<kDecodeC, kDecodeA + S, kDecodeB + S>();
        });
      store<kDecodeC>(acc, 4 * a.m);
      store_transposed(acc, a.m, rows, a.y + n, a.ldy, post);
    }
  }

  // Prefill shape: 128 weight rows at a time decoded (through `rows16`) into B tiles at `panel`, then every
  // group of x rows (xq, ⌈m / 32⌉ · 32 rows, the ones past m zeros) against them.
  void prefill_shape(const uint16_t* xq, uint16_t* rows16, uint32_t* panel, float* acc) const {
    for (int64_t p0 = a.n0; p0 < a.n1; p0 += kPanelRows) {
      const int64_t p1 = std::min(a.n1, p0 + kPanelRows);
      bool clean = true;
      for (int64_t n = p0, g = 0; n < p1; n += kTile, ++g) {
        const int64_t rows = std::min(kTile, p1 - n);
        clean = clean && decode(n, rows, rows16);
        if (!clean) break;
        for (int64_t s = 0; s < steps; ++s) {
          __m512i v[16];
          for (int64_t j = 0; j < 16; ++j)
            v[j] = j < rows ? _mm512_load_si512(rows16 + j * ld + s * 32) : _mm512_setzero_si512();
          transpose16(v);
          uint32_t* dst = panel + (g * steps + s) * kTileWords;
          for (int r = 0; r < 16; ++r) _mm512_store_si512(dst + r * 16, v[r]);
        }
      }
      if (!clean) {
        quant::reference_part(a, fallback, 0, a.m, p0, p1 - p0);
        continue;
      }
      for (int64_t i0 = 0; i0 < a.m; i0 += kRowGroup)
        panel_rows(xq + i0 * ld, ld, panel, steps, p0, p1, std::min(kRowGroup, a.m - i0), a.y + i0 * a.ldy,
                   a.ldy, post, acc);
    }
  }
};

template <bool NV>
void fp4_tile_linear(const LinearArgs& a) {
  quant::check_linear_args(a, NV ? WeightFormat::nvfp4 : WeightFormat::mxfp4);
  if (a.m == 0 || a.n0 == a.n1) return;
  const Fp4TileCall<NV> call(a);
  const bool decode = a.m <= kDecodeRows;
  // x rows rounded to bf16 in chunk order; for the prefill shape up to a whole group of 32 (zeros past m)
  const int64_t x_rows = decode ? a.m : (a.m + kRowGroup - 1) / kRowGroup * kRowGroup;
  Buffer<uint16_t> xq_buffer, rows_buffer;
  Buffer<uint32_t> tiles_buffer;  // decode: the x B tiles; prefill: 128 rows' decoded weights
  uint16_t* xq = xq_buffer.ensure(static_cast<size_t>(x_rows * call.ld));
  const avx512_bf16::Fp4Order order;
  for (int64_t i = 0; i < a.m; ++i)
    avx512_bf16::pack_fp4_x_row(order, a.x + i * a.ldx, call.k, call.padded, xq + i * call.ld, 32);
  for (int64_t i = a.m; i < x_rows; ++i)
    std::memset(xq + i * call.ld, 0, static_cast<size_t>(call.padded) * 2);
  uint16_t* rows = rows_buffer.ensure(static_cast<size_t>((decode ? 2 : 1) * kTile * call.ld));
  uint32_t* tiles =
      tiles_buffer.ensure(static_cast<size_t>((decode ? 1 : kPanelRows / kTile) * call.steps * kTileWords));
  alignas(64) float acc[4 * kTileWords];
  TileConfig config = full_tiles();
  if (decode)  // the accumulator and x tiles as wide as the rows
    for (const int t : {kDecodeC, kDecodeB, kDecodeB + 1}) config.colsb[t] = static_cast<uint16_t>(4 * a.m);
  load_config(config);
  if (decode)
    call.decode_shape(x_tiles(xq, call.ld, a.m, call.steps, tiles), rows, acc);
  else
    call.prefill_shape(xq, rows, tiles, acc);
  release();
}

}  // namespace

void linear_mxfp4_medium(const LinearArgs& a) {
  fp4_tile_linear<false>(a);
}
void linear_nvfp4_medium(const LinearArgs& a) {
  fp4_tile_linear<true>(a);
}

}  // namespace xmoe::kernels::amx
