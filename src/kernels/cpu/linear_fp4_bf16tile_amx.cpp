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
constexpr int64_t kGroupChunks = 2;     // decode: chunks of 128 columns decoded together
constexpr int64_t kAheadGroups = 1;     // decode: groups decoded ahead of the tile products
constexpr int64_t kPrefetchGroups = 4;  // decode: groups of each row prefetched ahead
constexpr int64_t kRowGroup = 32;       // prefill: x rows per group of A tiles
constexpr int64_t kPanelRows = 128;     // prefill: weight rows decoded at a time

template <bool NV>
struct Fp4TileCall {
  const LinearArgs& a;
  int64_t k, padded, steps;
  int64_t ld;         // words between rows of the packed x and of the decoded weights
  float post;         // NVFP4's global scale; 1 for MXFP4
  LinearFn fallback;  // the scalar reference of the format

  explicit Fp4TileCall(const LinearArgs& args)
      : a(args),
        k(args.w->cols),
        padded((k + kFp4Bf16DotChunk - 1) / kFp4Bf16DotChunk * kFp4Bf16DotChunk),
        steps(padded / kBf16TileStep),
        ld(padded + 32),
        post(NV ? args.w->global_scale : 1.0f),
        fallback(NV ? reference::linear_nvfp4_medium_tile : reference::linear_mxfp4_medium_tile) {}

  // NVFP4 rows [n, n + rows) as bf16 weights (E2M1 value · E4M3 scale) in chunk order, columns [c0, c1) of
  // row j at panel + j · ldp + (c - c0); zeros past k; false when a NaN scale code was met. Word w of a step
  // (bits 4s.. of word w of the chunk's 64 bytes) belongs to the chunk's scale block w / 4. Both factors are
  // made f32 in registers — the code's value by VPERMPS from its nibble, the scale by integer operations
  // (a subnormal E4M3 through an int-to-float conversion, so no f32 subnormal is involved) — and their
  // product, exact, is rounded to bf16 without loss.
  bool nvfp4_decode_rows(int64_t n, int64_t rows, uint16_t* panel, int64_t ldp, int64_t c0,
                         int64_t c1) const {
    const PackedWeight& w = *a.w;
    const __m512 values = _mm512_set_ps(-6.0f, -4.0f, -3.0f, -2.0f, -1.5f, -1.0f, -0.5f, -0.0f, 6.0f, 4.0f,
                                        3.0f, 2.0f, 1.5f, 1.0f, 0.5f, 0.0f);
    const __m512i lo_blocks = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    const __m512i hi_blocks = _mm512_add_epi32(lo_blocks, _mm512_set1_epi32(4));
    alignas(64) uint16_t first[32];  // step 0's element of each word
    for (int word = 0; word < 32; ++word)
      first[word] = static_cast<uint16_t>(8 * (word / 2) + 4 * (word % 2));
    const __m512i elements = _mm512_load_si512(first);
    __m128i highest = _mm_setzero_si128();  // the largest scale magnitude code (0x7F: NaN)
    for (int64_t j = 0; j < rows; ++j) {
      const auto* row = reinterpret_cast<const uint8_t*>(w.data) + (n + j) * w.row_bytes;
      const auto* codes = reinterpret_cast<const uint8_t*>(w.scales) + (n + j) * w.scale_row_stride;
      uint16_t* out = panel + j * ldp;
      for (int64_t c = c0; c < c1; c += kFp4Bf16DotChunk) {
        const int64_t left = k - c;
        const __m512i raw =
            left >= 128 ? _mm512_loadu_si512(row + c / 2)
                        : _mm512_maskz_loadu_epi8(avx512_bf16::byte_mask((left + 1) / 2), row + c / 2);
        const int64_t blocks = std::min<int64_t>(8, (left + 15) / 16);
        const __m128i code8 =
            _mm_maskz_loadu_epi8(static_cast<__mmask16>((1u << blocks) - 1), codes + c / 16);
        highest = _mm_max_epu8(highest, _mm_and_si128(code8, _mm_set1_epi8(0x7F)));
        const __m512i code = _mm512_maskz_cvtepu8_epi32(0xffff, code8);
        const __m512i mag = _mm512_and_si512(code, _mm512_set1_epi32(0x7F));
        // normal: exponent e + 120, mantissa m; subnormal (e = 0): m · 2^-9
        const __m512i normal =
            _mm512_add_epi32(_mm512_maskz_slli_epi32(0xffff, mag, 20), _mm512_set1_epi32(120 << 23));
        __m512 scale = _mm512_mask_mul_ps(_mm512_castsi512_ps(normal),
                                          _mm512_testn_epi32_mask(mag, _mm512_set1_epi32(0x78)),
                                          _mm512_maskz_cvtepi32_ps(0xffff, mag), _mm512_set1_ps(0x1p-9f));
        scale = _mm512_castsi512_ps(_mm512_or_si512(
            _mm512_castps_si512(scale),
            _mm512_maskz_slli_epi32(0xffff, _mm512_and_si512(code, _mm512_set1_epi32(0x80)), 24)));
        const __m512 lo_scale = _mm512_maskz_permutexvar_ps(0xffff, lo_blocks, scale),
                     hi_scale = _mm512_maskz_permutexvar_ps(0xffff, hi_blocks, scale);
        const __m512i lo_words =
                          _mm512_maskz_cvtepu16_epi32(0xffff, _mm512_maskz_extracti64x4_epi64(0xf, raw, 0)),
                      hi_words =
                          _mm512_maskz_cvtepu16_epi32(0xffff, _mm512_maskz_extracti64x4_epi64(0xf, raw, 1));
        for (int s = 0; s < 4; ++s) {
          const auto shift = static_cast<unsigned>(4 * s);
          const __m512 lo =
              _mm512_maskz_permutexvar_ps(0xffff, _mm512_maskz_srli_epi32(0xffff, lo_words, shift), values);
          const __m512 hi =
              _mm512_maskz_permutexvar_ps(0xffff, _mm512_maskz_srli_epi32(0xffff, hi_words, shift), values);
          __m512i v = (__m512i)_mm512_cvtne2ps_pbh(_mm512_mul_ps(hi, hi_scale), _mm512_mul_ps(lo, lo_scale));
          if (left < 128)  // zeros past k
            v = _mm512_maskz_mov_epi16(
                _mm512_cmplt_epu16_mask(_mm512_add_epi16(elements, _mm512_set1_epi16(static_cast<short>(s))),
                                        _mm512_set1_epi16(static_cast<short>(left))),
                v);
          _mm512_store_si512(out + (c - c0) + 32 * s, v);
        }
      }
    }
    return _mm_cmpeq_epi8_mask(highest, _mm_set1_epi8(0x7F)) == 0;
  }

  // Rows [n, n + rows), columns [c0, c1) (whole chunks), decoded at panel + j · ldp + (c - c0); false where
  // a code is left to the reference.
  bool decode(int64_t n, int64_t rows, uint16_t* panel, int64_t ldp, int64_t c0, int64_t c1) const {
    if constexpr (NV) {
      return nvfp4_decode_rows(n, rows, panel, ldp, c0, c1);
    } else {
      return avx512_bf16::mxfp4_decode_range(*a.w, n, rows, panel, ldp, c0, c1);
    }
  }

  // Decode shape: every 16 weight rows against the x B tiles (tile registers as the caller configured them).
  // Rows are decoded kGroupChunks chunks at a time into a ring of kAheadGroups + 1 slots (A tiles of 16 rows
  // kGroupChunks · 256 bytes apart) that stays in L1, a group kAheadGroups before its tiles are loaded (a
  // tile load waits for the older stores to its lines); the rows' lines kPrefetchGroups groups on are
  // prefetched, past a tile's end the next tile's.
  void decode_shape(const uint32_t* xb, uint16_t* ring, float* acc) const {
    constexpr int64_t kGroupWords = kGroupChunks * kFp4Bf16DotChunk, kSlot = kTile * kGroupWords;
    const int64_t groups = (padded + kGroupWords - 1) / kGroupWords, rb = a.w->row_bytes;
    for (int64_t n = a.n0; n < a.n1; n += kTile) {
      const int64_t rows = std::min(kTile, a.n1 - n);
      const auto* base = reinterpret_cast<const uint8_t*>(a.w->data) + n * rb;
      const bool next = n + kTile + rows <= a.w->rows;
      bool clean = true;
      zero<kDecodeC>();
      for (int64_t u = 0; u < groups + kAheadGroups; ++u) {
        if (u < groups) {
          const int64_t c0 = u * kGroupWords, pb = (c0 + kPrefetchGroups * kGroupWords) / 2;
          const uint8_t* ahead = pb < rb ? base + pb : next ? base + kTile * rb + (pb - padded / 2) : nullptr;
          if (ahead != nullptr)
            for (int64_t j = 0; j < rows; ++j)
              for (int64_t line = 0; line < kGroupChunks; ++line)
                _mm_prefetch(reinterpret_cast<const char*>(ahead + j * rb + 64 * line), _MM_HINT_T0);
          clean &= decode(n, rows, ring + u % (kAheadGroups + 1) * kSlot, kGroupWords, c0,
                          std::min(padded, c0 + kGroupWords));
        }
        if (u < kAheadGroups) continue;
        const int64_t v = u - kAheadGroups, s0 = v * kGroupWords / 32,
                      s1 = std::min(steps, s0 + kGroupWords / 32);
        const uint16_t* slot = ring + v % (kAheadGroups + 1) * kSlot;
        for (int64_t s = s0; s < s1; s += 2)
          static_for<2>([&](auto parity) {
            constexpr int S = decltype(parity)::value;
            load<kDecodeA + S>(slot + (s - s0 + S) * 32, kGroupWords * 2);
            load<kDecodeB + S>(xb + (s + S) * 16 * a.m, 4 * a.m);
            dpbf16<kDecodeC, kDecodeA + S, kDecodeB + S>();
          });
      }
      if (!clean) {
        quant::reference_part(a, fallback, 0, a.m, n, rows);
        continue;
      }
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
        clean = clean && decode(n, rows, rows16, ld, 0, padded);
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
  uint16_t* rows = rows_buffer.ensure(static_cast<size_t>(
      decode ? (kAheadGroups + 1) * kTile * kGroupChunks * kFp4Bf16DotChunk : kTile * call.ld));
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
