// The AMX level's `medium` linear for FP8 block weights (linear_quant_bf16tile.hpp's arithmetic, bit for bit
// the scalar reference's for every m, column block and thread). The weights are FP8 in memory, so unlike
// the BF16 kernel's they cannot be tile operands in place: their codes are turned into bf16 by
// fp8_codes_avx512_bf16.hpp's register decode and stored as tiles first. Each block of weight rows (one
// multiplier vector) scales and rounds the activations anew.
//  * Up to kDecodeRows x rows (decode, batched decode): yᵀ = W · xᵀ. Each 64-code chunk of 16 weight rows
//    is decoded into two A tiles in a small ring of buffers that stays in L1, kDecodeAhead chunks before
//    the tiles are loaded (a tile load waits for the older stores to its lines), with the rows' lines
//    kPrefetchChunks on prefetched (without, the 16 rows read at 8 GB/s instead of 14 on 2 threads). The
//    scaled x rows are B tiles and the accumulator only as wide as the rows (x tiles of 64 B a step for
//    one row: the block's stay in L1). Measured on Sapphire Rapids, 2 threads (`xmoe linear-bench
//    --matmul-precision medium --isa amx`, then `--isa avx512_bf16`): one row streams at 9.0 / 9.9 / 15.7
//    GB/s for the three shapes against VDPBF16PS's 9.9 / 10.1 / 16.3; at 8 and 16 rows a 2048 × 2048
//    FP8 linear took 338 and 389 µs against VDPBF16PS's 625 and 961. Two weight tiles per pass (two
//    accumulators) and decoding 2-8 chunks of a row at a time were slower.
//  * More x rows (prefill): y = x · Wᵀ. The block's weights are decoded once into B tiles (each 16 × 16
//    dword step transposed in registers), and the scaled x rows are A tiles as they are packed: 2 × 2 tiles
//    over 32 x rows × 32 outputs, the decoded block reused from L2 by every group of x rows. Prefill (512
//    rows) ran at 1000-1160 GFLOP/s against VDPBF16PS's 155-163 (the same linear-bench runs).
// A NaN code (which the register decode does not reproduce) sends its tile or block to the reference.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/amx_tiles.hpp"
#include "kernels/cpu/fp8_codes_avx512_bf16.hpp"
#include "kernels/cpu/linear_bf16tile.hpp"
#include "kernels/cpu/linear_quant.hpp"
#include "kernels/cpu/linear_quant_bf16tile.hpp"
#include "util/buffer.hpp"

namespace xmoe::kernels::amx {
namespace {

using avx512_bf16::byte_mask;
using avx512_bf16::Fp8Decoder;
using avx512_bf16::Fp8Order;
using avx512_bf16::Fp8Scales;

constexpr int64_t kTile = 16;        // outputs or x rows per tile side
constexpr int64_t kTileWords = 256;  // one 16 × 64-byte tile in 32-bit words
constexpr int64_t kDecodeRows = kFp8TileDecodeRows;
// decode: tile registers of the accumulator, the two steps' weights and the two steps' x rows
constexpr int kDecodeC = 0, kDecodeA = 1, kDecodeB = 3;
constexpr int64_t kDecodeAhead = 3;
constexpr int64_t kPrefetchChunks = 8;  // decode: chunks decoded ahead of the tile products
constexpr int64_t kRowGroup = 32;       // prefill: x rows per group of A tiles
constexpr int64_t kPanelRows = 128;  // prefill: weight rows decoded at a time (one block of FP8's 128 × 128)

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
// `rows` floats per output.
void store_transposed(const float* acc, int64_t rows, int64_t cols, float* y, int64_t ldy) {
  const __m512i outputs =
      _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                         _mm512_set1_epi32(static_cast<int>(rows)));
  const __mmask16 mask = cols == 16 ? __mmask16(0xffff) : __mmask16((1u << cols) - 1);
  for (int64_t r = 0; r < rows; ++r)
    _mm512_mask_storeu_ps(y + r * ldy, mask,
                          _mm512_mask_i32gather_ps(_mm512_setzero_ps(), mask, outputs, acc + r, 4));
}

// y[r, n] for the rows [0, rows) and outputs [n, n + cols) of an accumulator tile stored [x row][output].
void store_rows(const float* acc, int64_t rows, int64_t cols, float* y, int64_t ldy) {
  const __mmask16 mask = cols == 16 ? __mmask16(0xffff) : __mmask16((1u << cols) - 1);
  for (int64_t r = 0; r < rows; ++r) _mm512_mask_storeu_ps(y + r * ldy, mask, _mm512_load_ps(acc + r * 16));
}

struct Fp8TileCall {
  const LinearArgs& a;
  int64_t k, padded, steps;
  int64_t ldq;  // words between scaled x rows (padded plus a line, so 16 rows do not share an L1 set)
  const Fp8Order order;
  const Fp8Scales scales;

  Fp8TileCall(const LinearArgs& args)
      : a(args),
        k(args.w->cols),
        padded((k + 63) / 64 * 64),
        steps(padded / kBf16TileStep),
        ldq(padded + 32),
        order(),
        scales(*args.w) {}

  const uint8_t* row(int64_t n) const {
    return reinterpret_cast<const uint8_t*>(a.w->data) + n * a.w->row_bytes;
  }

  // x rows [i0, i0 + h), scaled by `mult` and rounded, in chunk order at xq + i · ldq; rows h..16·tiles
  // zeros.
  void pack_x(const float* mult, int64_t i0, int64_t h, int64_t tiles, uint16_t* xq) const {
    for (int64_t i = 0; i < h; ++i)
      avx512_bf16::pack_fp8_x_row(order, a.x + (i0 + i) * a.ldx, k, mult, padded, xq + i * ldq, 32);
    for (int64_t i = h; i < tiles * kTile; ++i) std::memset(xq + i * ldq, 0, static_cast<size_t>(padded) * 2);
  }

  // Decode shape. The a.m scaled x rows at xq as B tiles a.m dwords wide, step s at xb + s · 16 · a.m
  // words: word [r][i] holds row i's pair r of the step. One row is its own tile: xq as it is.
  const uint32_t* x_tiles(const uint16_t* xq, uint32_t* xb) const {
    if (a.m == 1) return reinterpret_cast<const uint32_t*>(xq);
    const auto mask = static_cast<__mmask16>((1u << a.m) - 1);
    for (int64_t s = 0; s < steps; ++s) {
      __m512i v[16];
      for (int i = 0; i < 16; ++i)
        v[i] = i < a.m ? _mm512_load_si512(xq + i * ldq + s * 32) : _mm512_setzero_si512();
      transpose16(v);
      for (int r = 0; r < 16; ++r) _mm512_mask_storeu_epi32(xb + (s * 16 + r) * a.m, mask, v[r]);
    }
    return xb;
  }

  // Decode shape: outputs [n, n + rows) (rows ≤ 16) against the x B tiles (tile registers as
  // decode_config sets them); accumulator [output][x row] to acc, a.m floats per output. `ring`:
  // kDecodeAhead + 1 chunks' pairs of A tiles, rows at 64 bytes. False on a NaN code.
  bool decode_tile(int64_t n, int64_t rows, const uint32_t* xb, uint16_t* ring, float* acc) const {
    constexpr int64_t kTileHalf = 2 * kTileWords;  // one A tile in 16-bit words
    const int64_t chunks = padded / 64, rb = a.w->row_bytes;
    const uint8_t* const base = row(n);
    // the next tile's rows, prefetched while this tile's last chunks are decoded
    const uint8_t* const next = n + kTile + rows <= a.w->rows ? row(n + kTile) : nullptr;
    Fp8Decoder dec;
    zero<kDecodeC>();
    // Chunk q is decoded kDecodeAhead iterations before its tiles are loaded, so its stores have left the
    // store buffer by then (a tile load waits for every older store to the lines it reads).
    for (int64_t q = 0; q < chunks + kDecodeAhead; ++q) {
      if (q < chunks) {
        uint16_t* t = ring + q % (kDecodeAhead + 1) * 2 * kTileHalf;
        const int64_t c = q * 64, pc = c + kPrefetchChunks * 64;
        const uint8_t* ahead = pc < k ? base + pc : next != nullptr ? next + (pc - padded) : nullptr;
        for (int64_t j = 0; j < rows; ++j) {
          if (ahead != nullptr) _mm_prefetch(reinterpret_cast<const char*>(ahead + j * rb), _MM_HINT_T0);
          bool fixup;
          const __m512i raw = dec.load(base + j * rb + c, k - c, fixup);
          _mm512_store_si512(t + j * 32, (__m512i)dec.step(raw, 0, fixup));
          _mm512_store_si512(t + kTileHalf + j * 32, (__m512i)dec.step(raw, 1, fixup));
        }
      }
      if (q < kDecodeAhead) continue;
      const int64_t d = q - kDecodeAhead;
      const uint16_t* t = ring + d % (kDecodeAhead + 1) * 2 * kTileHalf;
      static_for<2>([&](auto step) {
        constexpr int S = decltype(step)::value;
        load<kDecodeB + S>(xb + (2 * d + S) * 16 * a.m, 4 * a.m);
        load<kDecodeA + S>(t + S * kTileHalf, 64);
        dpbf16<kDecodeC, kDecodeA + S, kDecodeB + S>();
      });
    }
    store<kDecodeC>(acc, 4 * a.m);
    return dec.clean();
  }

  // Prefill shape: outputs [n, n + cols) (cols ≤ 16) decoded into B tiles, step s at panel + s · 256 words:
  // word [r][o] holds output o's pair r; outputs past cols are zeros. False on a NaN code.
  bool decode_panel(int64_t n, int64_t cols, uint32_t* panel) const {
    Fp8Decoder dec;
    for (int64_t c = 0, q = 0; c < k; c += 64, ++q)
      for (int step = 0; step < 2; ++step) {
        __m512i v[16];
        for (int64_t j = 0; j < 16; ++j) {
          if (j >= cols) {
            v[j] = _mm512_setzero_si512();
            continue;
          }
          bool fixup;
          const __m512i raw = dec.load(row(n + j) + c, k - c, fixup);
          v[j] = (__m512i)dec.step(raw, step, fixup);
        }
        transpose16(v);
        uint32_t* dst = panel + (2 * q + step) * kTileWords;
        for (int r = 0; r < 16; ++r) _mm512_store_si512(dst + r * 16, v[r]);
      }
    return dec.clean();
  }

  // Prefill shape: MT x-row tiles at xq (16 · ldq words apart) × NT output tiles of the panel (steps · 256
  // words apart); accumulator (i, j) to acc + (i · NT + j) · 256 as [x row][output].
  template <int MT, int NT>
  void tile_block(const uint16_t* xq, const uint32_t* panel, float* acc) const {
    constexpr int kA = MT * NT, kB = MT * NT + MT;
    static_assert(kB + NT <= 8, "eight tile registers");
    static_for<MT * NT>([](auto c) { zero<decltype(c)::value>(); });
    for (int64_t s = 0; s < steps; ++s) {
      static_for<NT>(
          [&](auto j) { load<kB + decltype(j)::value>(panel + (j * steps + s) * kTileWords, 64); });
      static_for<MT>([&](auto i) {
        constexpr int I = decltype(i)::value;
        load<kA + I>(xq + I * kTile * ldq + s * 32, ldq * 2);
        static_for<NT>([&](auto j) {
          constexpr int J = decltype(j)::value;
          dpbf16<I * NT + J, kA + I, kB + J>();
        });
      });
    }
    static_for<MT * NT>(
        [&](auto c) { store<decltype(c)::value>(acc + decltype(c)::value * kTileWords, 64); });
  }

  void decode_rows(int64_t s0, int64_t s1, const float* mult, uint16_t* xq, uint32_t* xb, uint16_t* ring,
                   float* acc) const {
    pack_x(mult, 0, a.m, 0, xq);
    const uint32_t* xt = x_tiles(xq, xb);
    for (int64_t n = s0; n < s1; n += kTile) {
      const int64_t rows = std::min(kTile, s1 - n);
      if (decode_tile(n, rows, xt, ring, acc))
        store_transposed(acc, a.m, rows, a.y + n, a.ldy);
      else
        quant::reference_part(a, reference::linear_fp8_block_medium_tile, 0, a.m, n, rows);
    }
  }

  void prefill_rows(int64_t s0, int64_t s1, const float* mult, uint16_t* xq, uint32_t* panel,
                    float* acc) const {
    const int64_t groups = (s1 - s0 + kTile - 1) / kTile;
    bool clean = true;
    for (int64_t g = 0; g < groups; ++g)
      clean &=
          decode_panel(s0 + g * kTile, std::min(kTile, s1 - s0 - g * kTile), panel + g * steps * kTileWords);
    if (!clean) return quant::reference_part(a, reference::linear_fp8_block_medium_tile, 0, a.m, s0, s1 - s0);
    for (int64_t i0 = 0; i0 < a.m; i0 += kRowGroup) {
      const int64_t h = std::min(kRowGroup, a.m - i0), mt = (h + kTile - 1) / kTile;
      pack_x(mult, i0, h, mt, xq);
      for (int64_t g = 0; g < groups; g += 2) {
        const int64_t nt = std::min<int64_t>(2, groups - g);
        const uint32_t* p = panel + g * steps * kTileWords;
        if (mt == 2 && nt == 2)
          tile_block<2, 2>(xq, p, acc);
        else if (mt == 2)
          tile_block<2, 1>(xq, p, acc);
        else if (nt == 2)
          tile_block<1, 2>(xq, p, acc);
        else
          tile_block<1, 1>(xq, p, acc);
        for (int64_t i = 0; i < mt; ++i)
          for (int64_t j = 0; j < nt; ++j) {
            const int64_t n = s0 + (g + j) * kTile;
            store_rows(acc + (i * nt + j) * kTileWords, std::min(kTile, h - i * kTile),
                       std::min(kTile, s1 - n), a.y + (i0 + i * kTile) * a.ldy + n, a.ldy);
          }
      }
    }
  }
};

}  // namespace

void linear_fp8_block_medium(const LinearArgs& a) {
  quant::check_linear_args(a, WeightFormat::fp8_block);
  if (a.m == 0 || a.n0 == a.n1) return;
  const Fp8TileCall call(a);
  std::vector<float> mult(static_cast<size_t>(call.k));
  alignas(64) float acc[4 * kTileWords];
  const bool decode = a.m <= kDecodeRows;
  Buffer<uint16_t> xq_buffer, ring_buffer;
  Buffer<uint32_t> tiles_buffer;  // decode: the x B tiles; prefill: a piece's decoded weights
  uint16_t* xq = xq_buffer.ensure(static_cast<size_t>((decode ? a.m : kRowGroup) * call.ldq));
  uint32_t* tiles =
      tiles_buffer.ensure(static_cast<size_t>((decode ? 1 : kPanelRows / kTile) * call.steps * kTileWords));
  uint16_t* ring = ring_buffer.ensure(static_cast<size_t>((kDecodeAhead + 1) * 2 * 2 * kTileWords));
  if (decode)  // the first tile's first lines, on their way while x is scaled and packed
    for (int64_t j = 0; j < std::min(kTile, a.n1 - a.n0); ++j)
      for (int64_t c = 0; c < std::min(call.k, kPrefetchChunks * 64); c += 64)
        _mm_prefetch(reinterpret_cast<const char*>(call.row(a.n0 + j) + c), _MM_HINT_T0);
  TileConfig config = full_tiles();
  if (decode)  // the accumulator and x tiles as wide as the rows: a block's x tiles stay in L1
    for (const int t : {kDecodeC, kDecodeB, kDecodeB + 1}) config.colsb[t] = static_cast<uint16_t>(4 * a.m);
  load_config(config);
  avx512_bf16::for_each_row_block(*a.w, a.n0, a.n1, [&](int64_t s0, int64_t s1) {
    call.scales.row(s0, mult.data());
    for (int64_t p0 = s0; p0 < s1; p0 += kPanelRows) {
      const int64_t p1 = std::min(s1, p0 + kPanelRows);
      if (decode)
        call.decode_rows(p0, p1, mult.data(), xq, tiles, ring, acc);
      else
        call.prefill_rows(p0, p1, mult.data(), xq, tiles, acc);
    }
  });
  release();
}

}  // namespace xmoe::kernels::amx
