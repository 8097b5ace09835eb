// The `medium` precision's linears over block-quantized weights on AVX512-BF16, bit-identical to
// linear_quant_bf16dot_reference.cpp (the arithmetic is in linear_quant_bf16dot.hpp). Weights are read in
// place and turned into bf16 in registers with a few integer operations per 32 weights:
//  * FP4: 64 bytes read as 32 words hold 4 nibbles each; nibble s of every word (a shift by 4·s) indexes a
//    32-word table of the E2M1 values' bf16 bits twice over (VPERMW reads an index's low 5 bits, so no mask);
//  * FP8: the low / high byte of each word, moved into the word's high byte and shifted right arithmetically
//    by 4, gives S.EEEE.MMM in bf16 position; the exponent rebiased by OR-ing 112 (value × 2^-8). E4M3
//    subnormals and zeros (exponent 0) are replaced by a masked VPERMW from an 8-entry table, only in the
//    chunks that hold one (a branch per chunk, rarely taken on trained or random weights).
// NVFP4 block scales multiply the f32 partial sums once per lane and chunk (one masked FMA per 32 weights and
// row); MXFP4's E8M0 scales are powers of two, so they go into the codes (decoded panels) or, in the register
// path, into the accumulators' scaled domain (Fp4Scales below). Scale codes become f32 or exponent changes by
// shifts, 32 codes of a row at a time; the codes those shifts do not cover (NaN, negative NVFP4 scales, E8M0
// codes out of the path's range) are rare enough to be tracked by a running max/min, and a tile that met one
// is computed again by the reference. FP4 x rows are rounded to bf16 once per call, in the chunk order the
// weights unpack to.
// FP8 block scales multiply x instead: for each block of 128 weight rows, x rows are scaled by that block's
// multiplier vector and rounded (VCVTNE2PS2BF16, even/odd split by VPERMT2W), and the products are plain
// VDPBF16PS chains; NaN codes are tracked by a running max. Up to kQuantPanelMinRowsFp8 x rows, weight rows
// stream in small groups (stream()), each group against every tile of x rows while it is in L1, the group
// after next prefetched into L2 meanwhile; from there, groups of rows are decoded into a bf16 panel and
// bf16dot_tiles_avx512_bf16.hpp's tiles (the BF16 linear's) run over it, decoding the next group into a
// second panel between their steps where that pays (decoded_panel_columns); MXFP4 from
// kQuantPanelMinRowsMxfp4 rows decodes groups into one panel the same way, each before its tiles.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/cpu/bf16dot_lanes_avx512_bf16.hpp"
#include "kernels/cpu/bf16dot_tiles_avx512_bf16.hpp"
#include "kernels/cpu/fp4_codes_avx512_bf16.hpp"
#include "kernels/cpu/fp8_codes_avx512_bf16.hpp"
#include "kernels/cpu/linear_quant.hpp"
#include "kernels/cpu/linear_quant_bf16dot.hpp"
#include "kernels/cpu/linear_quant_bf16dot_panel_avx512_bf16.hpp"
#include "kernels/cpu/linear_reduce_avx512.hpp"
#include "kernels/quant/codecs.hpp"
#include "util/buffer.hpp"

namespace xmoe::kernels::avx512_bf16 {
namespace {

// The decoded-panel paths prefetch the raw rows of the group this many groups on (as the BF16 linear does).
constexpr int64_t kPanelAhead = 2;

// y for MR packed x rows (xp, rows `padded` apart) and NR FP4 weight rows from `data`; false when a scale
// code the shifts do not decode was met (y is then not written). `ahead` / `codes_ahead`: prefetch distance
// of the weight and scale streams in bytes (0: none).
template <bool NV, int MR, int NR>
bool fp4_tile(const uint8_t* data, int64_t row_bytes, const uint8_t* codes, int64_t code_stride, int64_t k,
              const uint16_t* xp, int64_t padded, float* y, int64_t ldy, __m512 global, int64_t ahead,
              int64_t codes_ahead) {
  using Scales = Fp4Scales<NV>;
  const __m512i table = e2m1_bf16_table();
  Scales scales{global};
  __m512 acc[MR][NR];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
  // MXFP4: the accumulators run in the scaled domain, acc = Σ x · w · 2^(code - 127) / 2^(current code -
  // 127), so the products take the raw E2M1 values; between chunks each lane's accumulator is multiplied by
  // 2^(previous - current), at the end by 2^(last - 127). Powers of two commute with every rounding while no
  // value leaves the normal range, which the caller's guards ensure (linear_quant_bf16dot.hpp).
  // Each lane's ratio per chunk comes from one permute of ratio words, (previous code - code + 127) << 7,
  // made once per 32 codes: a lane reads code slot 4t + l / 4 in chunk t, so its previous code is 4 slots
  // back (in the previous group's words for t = 0; 127, i.e. 2^0, before the first).
  __m512i previous[NR], last_index = Scales::first_index();  // previous: the last group's words at the end
#pragma GCC unroll 8
  for (int j = 0; j < NR; ++j) previous[j] = _mm512_set1_epi16(127 << 7);
  const __m512i back = Scales::previous_slot_index();
  constexpr int64_t kGroup = 128 * Scales::kGroupChunks;
  for (int64_t g = 0; g < k; g += kGroup) {
    __m512i words[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) {
      const uint8_t* q = codes + j * code_stride + g / Scales::kBlock;
      if (codes_ahead != 0) _mm_prefetch(reinterpret_cast<const char*>(q + codes_ahead), _MM_HINT_T1);
      words[j] = scales.words(q, (k - g) / Scales::kBlock);
    }
    __m512i ratio_words[NR];
    if constexpr (!NV) {
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) {
        ratio_words[j] = _mm512_add_epi16(
            _mm512_sub_epi16(_mm512_permutex2var_epi16(previous[j], back, words[j]), words[j]),
            _mm512_set1_epi16(127 << 7));
        previous[j] = words[j];
      }
    }
    __m512i index = Scales::first_index();
    for (int64_t c = g; c < std::min(k, g + kGroup); c += 128, index = Scales::next_index(index)) {
      const int64_t left = k - c;
      __m512i raw[NR];
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) {
        const uint8_t* d = data + j * row_bytes + c / 2;
        if (ahead != 0) _mm_prefetch(reinterpret_cast<const char*>(d + ahead), _MM_HINT_T1);
        raw[j] = left >= 128 ? _mm512_loadu_si512(d) : _mm512_maskz_loadu_epi8(byte_mask(left / 2), d);
      }
      // The chunk's 4 steps of products added into sums (from zero when `fresh` is std::true_type).
      const auto chunk_products = [&](__m512(&sums)[MR][NR], auto fresh) {
        constexpr bool kFresh = decltype(fresh)::value;
#pragma GCC unroll 4
        for (int s = 0; s < 4; ++s) {
          __m512bh wv[NR];
#pragma GCC unroll 8
          for (int j = 0; j < NR; ++j)
            wv[j] = (__m512bh)_mm512_permutexvar_epi16(
                s == 0 ? raw[j] : _mm512_srli_epi16(raw[j], static_cast<unsigned>(4 * s)), table);
#pragma GCC unroll 4
          for (int i = 0; i < MR; ++i) {
            const __m512bh xv = (__m512bh)_mm512_load_si512(xp + i * padded + c + 32 * s);
#pragma GCC unroll 8
            for (int j = 0; j < NR; ++j)
              sums[i][j] = _mm512_dpbf16_ps(kFresh && s == 0 ? _mm512_setzero_ps() : sums[i][j], xv, wv[j]);
          }
        }
      };
      if constexpr (!NV) {  // one plain chain per output, in the scaled domain
        last_index = index;
#pragma GCC unroll 8
        for (int j = 0; j < NR; ++j) {
          const __m512 ratio = _mm512_castsi512_ps(Scales::multiplier_bits(ratio_words[j], index));
#pragma GCC unroll 4
          for (int i = 0; i < MR; ++i) acc[i][j] = _mm512_mul_ps(acc[i][j], ratio);
        }
        chunk_products(acc, std::false_type{});
      } else {  // NVFP4: partial sums, then the multiplier
        __m512 part[MR][NR];
        chunk_products(part, std::true_type{});
        const __mmask16 lanes = lane_mask(left / 8);
#pragma GCC unroll 8
        for (int j = 0; j < NR; ++j) {
          const __m512 mult = scales.chunk(words[j], index);
#pragma GCC unroll 4
          for (int i = 0; i < MR; ++i) acc[i][j] = _mm512_mask3_fmadd_ps(part[i][j], mult, acc[i][j], lanes);
        }
      }
    }
  }
  if (!scales.clean()) return false;
  if constexpr (!NV)
    for (int j = 0; j < NR; ++j) {
      const __m512 last = _mm512_castsi512_ps(Scales::multiplier_bits(previous[j], last_index));
      for (int i = 0; i < MR; ++i) acc[i][j] = _mm512_mul_ps(acc[i][j], last);
    }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) y[i * ldy + j] = reduce16(acc[i][j]);
  return true;
}

// y (rows ldy apart, columns from y) for MR scaled x rows (xq: chunk order, rows `padded` words apart) and NR
// FP8 weight rows from `data`, decoded in registers; false when a NaN code was met (y is then not written).
// `ahead`: prefetch distance of the weight stream in bytes (0: none). Guarded: false for rows known to hold
// no NaN code.
template <int MR, int NR, bool Guarded>
bool fp8_tile(const uint8_t* data, int64_t row_bytes, int64_t k, const uint16_t* xq, int64_t padded, float* y,
              int64_t ldy, int64_t ahead) {
  Fp8CodeDecoder<Guarded> dec;
  __m512 acc[MR][NR];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t c = 0; c < k; c += 64) {
    const int64_t left = k - c;
    __m512i raw[NR];
    bool fixup = false;
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) {
      const uint8_t* d = data + j * row_bytes + c;
      if (ahead != 0) _mm_prefetch(reinterpret_cast<const char*>(d + ahead), _MM_HINT_T1);
      bool row_fixup;
      raw[j] = dec.load(d, left, row_fixup);
      fixup |= row_fixup;
    }
#pragma GCC unroll 2
    for (int s = 0; s < 2; ++s) {
      __m512bh wv[NR];
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) wv[j] = dec.step(raw[j], s, fixup);
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i) {
        const __m512bh xv = (__m512bh)_mm512_load_si512(xq + i * padded + c + 32 * s);
#pragma GCC unroll 8
        for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], xv, wv[j]);
      }
    }
  }
  if (!dec.clean()) return false;
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) y[i * ldy + j] = reduce16(acc[i][j]);
  return true;
}

// Weight rows in groups of NR (then one by one), each group against every tile of up to MRMAX x rows while
// it is in L1. Tiles are of nearly equal height (5 rows: 3 + 2, not 4 + 1), so no tile is left with a
// single row's few independent chains.
template <int MRMAX, int NR, class Tile>
void stream_shape(const LinearArgs& a, int64_t n0, int64_t n1, const Tile& tile) {
  const int64_t tiles = (a.m + MRMAX - 1) / MRMAX;
  const auto run_tiles = [&]<int R>(int64_t n) {
    for (int64_t t = 0; t < tiles; ++t) {
      const int64_t i0 = a.m * t / tiles;
      tile.template run<MRMAX, R>(i0, a.m * (t + 1) / tiles - i0, n);
    }
  };
  int64_t n = n0;
  for (; n + NR <= n1; n += NR) run_tiles.template operator()<NR>(n);
  for (; n < n1; ++n) run_tiles.template operator()<1>(n);
}

// Decode (m ≤ 2): Tile::kDecodeRows weight rows (FP4 4, FP8 2), or Tile::kWideDecodeRows where the tile
// says `wide`, against one tile of the x rows. From 3 rows: 2 weight rows against tiles of up to 4 x rows, so
// each weight vector decoded feeds twice the products. All keep their partial sums, accumulators, weights and
// multipliers in the 32 vector registers; the shape changes no bit. 3 rows ran as the decode shape's tiles of
// 2 + 1 rows, decoding every weight twice; as one tile of 3 (one thread, `linear-bench --threads 1 --clock
// thread --matmul-precision medium --prefill-rows 3`, 768 × 2048): FP8 95 → 131, MXFP4 120 → 133, NVFP4 117 →
// 146 GFLOP/s; at 2 rows the decode shape stays ahead (FP8 110 vs 107, MXFP4 140 vs 96-105, NVFP4 132 vs
// 121). Columns [n0, n1).
template <class Tile>
void stream(const LinearArgs& a, int64_t n0, int64_t n1, const Tile& tile) {
  if (a.m <= 2) {
    if (tile.wide) return stream_shape<2, Tile::kWideDecodeRows>(a, n0, n1, tile);
    return stream_shape<2, Tile::kDecodeRows>(a, n0, n1, tile);
  }
  stream_shape<4, 2>(a, n0, n1, tile);
}

// The decode tiles' widths differ by CPU (kernel_table picks the form by vendor): the ones above were tuned
// on Sapphire Rapids. On Zen 4 (2 vCPUs) they ran short over weight rows of under 1 KiB (the experts' down
// projection, k = 768): a tile then ends every 1.5 KiB of its 2 streams (FP8) or 4 (FP4), and its reductions
// and set-up between the reads cost more than the stream allows (one thread decoding FP8 from L2: 2 weight
// rows a tile ~31 GB/s, 4 rows ~37). So the wide form takes twice the weight rows there: FP8 4 (at 1-2 x
// rows), FP4 8 (at 1 x row; at 2, 8 rows spill: MXFP4 67 % of the probe against 74 %). `xmoe linear-bench
// --matmul-precision medium --vendor-forms`, 5 runs of 7-11 passes, 2048 × 768: FP8 1.10-1.29x the narrow
// tiles' GB/s (77-85 % → 85 % of the probe at 31-34 GB/s), MXFP4 1.04-1.16x, NVFP4 0.99-1.07x. Rows of 1 KiB
// and more keep the narrow tiles: there FP8's 4-row tiles measured 0.95-1.02x (768 × 2048 and 4096 × 2048),
// FP4's 8-row ones lost 3-10 % (a scratch test streaming copies).
inline constexpr int64_t kWideDecodeMaxRowBytes = 1023;

// f(std::integral_constant<int, MR>) for MR = rows (1..MRMAX).
template <int MRMAX, class F>
bool dispatch_rows(int64_t rows, const F& f) {
  switch (rows) {
    case 1:
      return f(std::integral_constant<int, 1>{});
    case 2:
      if constexpr (MRMAX >= 2) return f(std::integral_constant<int, 2>{});
      break;
    case 3:
      if constexpr (MRMAX >= 3) return f(std::integral_constant<int, 3>{});
      break;
    case 4:
      if constexpr (MRMAX >= 4) return f(std::integral_constant<int, 4>{});
      break;
    default:
      break;
  }
  return false;  // not reached: the caller redoes the tile
}

template <bool NV>
struct Fp4Tile {
  // FP4 decode is bound by its arithmetic on Sapphire Rapids: 2 weight rows a tile made the experts' down
  // shape read 14 GB/s instead of 16.
  static constexpr int kDecodeRows = 4, kWideDecodeRows = 8;
  const LinearArgs& a;
  const uint16_t* xp;
  int64_t padded;
  __m512 global;
  LinearFn reference;
  bool wide;
  template <int MRMAX, int NR>
  void run(int64_t i0, int64_t rows, int64_t n) const {
    const PackedWeight& w = *a.w;
    const auto* data = reinterpret_cast<const uint8_t*>(w.data) + n * w.row_bytes;
    const auto* codes = reinterpret_cast<const uint8_t*>(w.scales) + n * w.scale_row_stride;
    // The group after next, at the same column (rows are contiguous): prefetched by the first x tile only.
    const int64_t ahead = i0 == 0 && n + 3 * NR <= a.n1 ? 2 * NR * w.row_bytes : 0;
    const uint16_t* x = xp + i0 * padded;
    float* y = a.y + i0 * a.ldy + n;
    const bool ok = dispatch_rows<MRMAX>(rows, [&](auto mr) {
      return fp4_tile<NV, decltype(mr)::value, NR>(data, w.row_bytes, codes, w.scale_row_stride, w.cols, x,
                                                   padded, y, a.ldy, global, ahead,
                                                   ahead != 0 ? 2 * NR * w.scale_row_stride : 0);
    });
    if (!ok) quant::reference_part(a, reference, i0, rows, n, NR);
  }
};

struct Fp8Tile {
  // FP8 decodes cheaply enough to be bound by the stream, and there fewer row streams at once read faster (as
  // for BF16, linear_avx512.cpp's rows_block): 2 weight rows a tile at m ≤ 2. `xmoe linear-bench --threads 2
  // --matmul-precision medium --isa avx512_bf16` on Sapphire Rapids, two alternated runs: FP8 decode
  // 21.1-25.8 → 24.0-28.0 GB/s (64-79 → 73-85 % of the probe) against 4 rows a tile.
  static constexpr int kDecodeRows = 2, kWideDecodeRows = 4;
  const LinearArgs& a;
  const uint16_t* xq;
  int64_t padded;
  bool wide;
  template <int MRMAX, int NR>
  void run(int64_t i0, int64_t rows, int64_t n) const {
    const PackedWeight& w = *a.w;
    const auto* data = reinterpret_cast<const uint8_t*>(w.data) + n * w.row_bytes;
    const int64_t ahead = i0 == 0 && n + 3 * NR <= a.n1 ? 2 * NR * w.row_bytes : 0;
    float* y = a.y + i0 * a.ldy + n;
    const bool ok = w.decode_rows_nan_checked(n, NR, [&]<bool Guarded>() {
      return dispatch_rows<MRMAX>(rows, [&](auto mr) {
        return fp8_tile<decltype(mr)::value, NR, Guarded>(data, w.row_bytes, w.cols, xq + i0 * padded, padded,
                                                          y, a.ldy, ahead);
      });
    });
    if (!ok) quant::reference_part(a, reference::linear_fp8_block_medium, i0, rows, n, NR);
  }
};

// One unit: the 64-column chunk of a row from column c (k columns in all) into out + c.
[[gnu::always_inline]] inline void fp8_decode_unit(Fp8Decoder& dec, const uint8_t* row, int64_t c, int64_t k,
                                                   uint16_t* out) {
  bool fixup;
  const __m512i raw = dec.load(row + c, k - c, fixup);
  for (int s = 0; s < 2; ++s) _mm512_store_si512(out + c + 32 * s, (__m512i)dec.step(raw, s, fixup));
}

// FP8 rows [n, n + rows) as bf16 weights (code value × 2^-8) in chunk order, row j at panel + j · ldp (ldp:
// k padded to 64; the codes past k read as zeros, whose products with x's zeros are zeros); false when a NaN
// code was met, else the rows are recorded free of them (PackedWeight::nan_free_rows: the decode tiles may
// trust them later).
bool fp8_decode_rows(const PackedWeight& w, int64_t n, int64_t rows, uint16_t* panel, int64_t ldp) {
  const int64_t k = w.cols;
  Fp8Decoder dec;
  for (int64_t j = 0; j < rows; ++j) {
    const auto* row = reinterpret_cast<const uint8_t*>(w.data) + (n + j) * w.row_bytes;
    for (int64_t c = 0; c < k; c += 64) fp8_decode_unit(dec, row, c, k, panel + j * ldp);
  }
  if (!dec.clean()) return false;
  w.mark_rows_nan_free(n, rows);
  return true;
}

// The same decode as fp8_decode_rows, one unit at a time, in row order (a loop over these units measured
// 3-13 % slower than fp8_decode_rows' own at 12-24 x rows, where whole groups are decoded). clean(), asked
// once every unit is decoded, records clean rows as fp8_decode_rows does.
class Fp8PanelRows {
 public:
  Fp8PanelRows(const PackedWeight& w, int64_t n, int64_t rows, uint16_t* panel, int64_t ldp)
      : w_(&w),
        n_(n),
        rows_(rows),
        row_(reinterpret_cast<const uint8_t*>(w.data) + n * w.row_bytes),
        row_bytes_(w.row_bytes),
        k_(w.cols),
        units_(rows * ((w.cols + 63) / 64)),
        out_(panel),
        ldp_(ldp) {}
  int64_t units() const { return units_; }
  void decode_next() {
    fp8_decode_unit(dec_, row_, c_, k_, out_);
    if ((c_ += 64) >= k_) {
      c_ = 0;
      row_ += row_bytes_;
      out_ += ldp_;
    }
  }
  bool clean() const {
    if (!dec_.clean()) return false;
    w_->mark_rows_nan_free(n_, rows_);
    return true;
  }

 private:
  const PackedWeight* w_;
  int64_t n_, rows_;
  const uint8_t* row_;
  int64_t row_bytes_, k_, units_;
  uint16_t* out_;
  int64_t ldp_, c_ = 0;
  Fp8Decoder dec_;
};

// One group's decode (Rows: units(), decode_next(), clean()) spread evenly over the steps of the tiles that
// run meanwhile as their side work (bf16dot_tiles: plan, step), then finish() for what is left.
template <class Rows>
class SpreadDecode {
 public:
  explicit SpreadDecode(Rows rows) : rows_(std::move(rows)), units_(rows_.units()) {}
  void plan(int64_t steps) {
    steps_ = std::max<int64_t>(steps, 1);
    owed_ = 0;
  }
  void step() {
    for (owed_ += units_; owed_ >= steps_ && done_ < units_; owed_ -= steps_, ++done_) rows_.decode_next();
  }
  // Decodes the rest; false when a code left to the reference was met.
  bool finish() {
    for (; done_ < units_; ++done_) rows_.decode_next();
    return rows_.clean();
  }

 private:
  Rows rows_;
  int64_t units_, steps_ = 1, owed_ = 0, done_ = 0;
};

// Weight rows [s0, s1) against `rows` x rows from c0, in chunk order and in bf16dot_tiles' layout in xp:
// groups of NR rows (the last 1 to NR - 1 rows as one group) decoded into a panel (rows ldp words apart: k
// padded to the format's chunk) by decode(w, n, rows, panel, ldp) (false when it met a code left to the
// reference, whose group the reference then computes), then bf16dot_tiles' register tiles over it as over
// BF16 rows of the padded length (the order is the same permutation of k in both operands); the raw rows of
// the group kPanelAhead groups on are prefetched into L2 meanwhile. `panels` holds NR · ldp words, twice
// that with a Spread decoder.
//
// With a Spread decoder (FP8's Fp8PanelRows; void: none) and more than two tile steps per unit of a group's
// decode, the next group is decoded into the second panel between the steps of this group's tiles instead,
// so the decode's integer work issues beside their VDPBF16PS rather than between groups. FP8, one thread,
// from cache: 768 × 2048 at 32 x rows 168-173 → 183-187 GFLOP/s (BF16 184-194), 64 rows 181 → 195-197, 512
// rows 176-183 → 195-199; 2048 × 768 at 32 rows 162-164 → 167-176. With more decode a step it lost (16 rows,
// a unit every 1.3 steps: 155-161 → 144-151; 12 rows, one a step: 147 → 110: a decode between steps spills
// accumulators), as MXFP4's row-block decode did at every row count (a unit decodes a chunk of every row,
// each row's scale words live: 20-25 % slower), so those decode a whole group before its tiles.
template <int NR, class Spread, class Decode>
void decoded_panel_columns(const LinearArgs& a, int64_t c0, int64_t rows, const uint16_t* xp, int64_t s0,
                           int64_t s1, uint16_t* panels, int64_t ldp, const Decode& decode,
                           LinearFn reference) {
  const PackedWeight& w = *a.w;
  const int64_t steps = ldp / 32;
  const auto* data = reinterpret_cast<const char*>(w.data);
  float* y = a.y + c0 * a.ldy;
  const auto group_rows = [&](int64_t j) { return std::clamp<int64_t>(s1 - j, 0, NR); };
  // The tiles of the group at j (cols rows, decoded in panel) with side work `side`. A last group of 1 to
  // NR - 1 rows runs as one group (a single-row group loads every x vector for one product).
  const auto tiles = [&](int64_t j, int64_t cols, const uint16_t* panel, auto* side) {
    const auto* weights = reinterpret_cast<const bf16*>(panel);
    const int64_t ahead = j + kPanelAhead * NR;
    const bool prefetch = cols == NR && ahead + NR <= a.n1;
    const auto run = [&](auto nr) {
      bf16dot_tiles::group<decltype(nr)::value>(xp, rows, steps, weights, ldp, ldp, y + j, a.ldy,
                                                prefetch ? data + ahead * w.row_bytes : nullptr,
                                                prefetch ? NR * w.row_bytes : 0, side);
    };
    static_assert(NR >= 2 && NR <= 6);
    switch (cols) {
      case 1:
        return run(std::integral_constant<int, 1>{});
      case 2:
        return run(std::integral_constant<int, 2>{});
      case 3:
        if constexpr (NR >= 3) return run(std::integral_constant<int, 3>{});
        break;
      case 4:
        if constexpr (NR >= 4) return run(std::integral_constant<int, 4>{});
        break;
      case 5:
        if constexpr (NR >= 5) return run(std::integral_constant<int, 5>{});
        break;
      default:
        if constexpr (NR >= 6) return run(std::integral_constant<int, 6>{});
        break;
    }
  };
  if constexpr (!std::is_void_v<Spread>) {
    uint16_t* const panel[2] = {panels, panels + NR * ldp};
    if (2 * Spread(w, s0, NR, panel[0], ldp).units() < bf16dot_tiles::tile_count(rows, steps) * steps) {
      bool clean = decode(w, s0, group_rows(s0), panel[0], ldp);
      for (int64_t j = s0, cur = 0; j < s1; j += NR, cur ^= 1) {
        SpreadDecode<Spread> next(Spread(w, j + NR, group_rows(j + NR), panel[cur ^ 1], ldp));
        if (clean)
          tiles(j, group_rows(j), panel[cur], &next);
        else
          quant::reference_part(a, reference, c0, rows, j, group_rows(j));
        clean = next.finish();
      }
      return;
    }
  }
  for (int64_t j = s0; j < s1; j += NR) {
    if (decode(w, j, group_rows(j), panels, ldp))
      tiles(j, group_rows(j), panels, static_cast<bf16dot_tiles::NoSideWork*>(nullptr));
    else
      quant::reference_part(a, reference, c0, rows, j, group_rows(j));
  }
}

struct Nvfp4Panel {
  const PackedWeight* w;
  __m512 global;
};

bool nvfp4_panel(const void* context, int64_t n, int rows, uint16_t* panel) {
  const Nvfp4Panel& p = *static_cast<const Nvfp4Panel*>(context);
  const PackedWeight& w = *p.w;
  const int64_t k = w.cols;
  const __m512i table = e2m1_bf16_table();
  using Scales = Fp4Scales<true>;
  constexpr int64_t kGroup = 128 * Scales::kGroupChunks;
  Scales scales{p.global};
  for (int j = 0; j < rows; ++j) {
    const auto* row = reinterpret_cast<const uint8_t*>(w.data) + (n + j) * w.row_bytes;
    const auto* codes = reinterpret_cast<const uint8_t*>(w.scales) + (n + j) * w.scale_row_stride;
    // The same row of the next group (the panel path's next decode), into L2 while this group's tiles run.
    const bool ahead = n + j + rows < w.rows;
    __m512i words = _mm512_setzero_si512(), index = Scales::first_index();
    for (int64_t c = 0; c < k; c += 128, index = Scales::next_index(index)) {
      const int64_t left = k - c;
      if (c % kGroup == 0) {  // the next 32 scale codes, as fp4_tile takes them
        words = scales.words(codes + c / Scales::kBlock, left / Scales::kBlock);
        index = Scales::first_index();
      }
      if (ahead) {
        _mm_prefetch(reinterpret_cast<const char*>(row + rows * w.row_bytes + c / 2), _MM_HINT_T1);
        if (c / Scales::kBlock % 64 == 0)
          _mm_prefetch(reinterpret_cast<const char*>(codes + rows * w.scale_row_stride + c / Scales::kBlock),
                       _MM_HINT_T1);
      }
      const __m512i raw = left >= 128 ? _mm512_loadu_si512(row + c / 2)
                                      : _mm512_maskz_loadu_epi8(byte_mask(left / 2), row + c / 2);
      const __m512 mult = scales.chunk(words, index);
      uint16_t* out = panel + (c / 128 * rows + j) * 5 * 32;
      for (int s = 0; s < 4; ++s)
        _mm512_store_si512(out + 32 * s,
                           _mm512_permutexvar_epi16(
                               s == 0 ? raw : _mm512_srli_epi16(raw, static_cast<unsigned>(4 * s)), table));
      _mm512_store_ps(out + 128, _mm512_maskz_mov_ps(lane_mask(left / 8), mult));
    }
  }
  return scales.clean();
}

// Whether every packed bf16 activation is zero or of magnitude in [2^-64, 2^64) (kMxfp4ScaleReach's guard).
bool mxfp4_x_in_range(const uint16_t* xp, int64_t words) {
  __mmask32 bad = 0;
  for (int64_t p = 0; p < words; p += 32) {
    const __m512i mag = _mm512_and_si512(_mm512_load_si512(xp + p), _mm512_set1_epi16(0x7FFF));
    const __mmask32 nonzero = _mm512_test_epi16_mask(mag, mag);
    bad |= _mm512_mask_cmplt_epu16_mask(nonzero, mag, _mm512_set1_epi16(0x1F80)) |
           _mm512_mask_cmpgt_epu16_mask(nonzero, mag, _mm512_set1_epi16(0x5F7F));
  }
  return bad == 0;
}

template <bool NV>
void fp4_linear(const LinearArgs& a, WeightFormat format, LinearFn reference, bool wide_decode) {
  quant::check_linear_args(a, format);
  if (a.m == 0 || a.n0 == a.n1) return;
  const float g = a.w->global_scale;
  // NVFP4's multipliers come out exact from the shifted codes when global · 2^120 is (|g| < 2^8) and E4M3
  // subnormal scales, f32 subnormals here, are not read as zero (MXCSR.DAZ).
  constexpr unsigned kDenormalsAreZero = 0x40;
  if (NV && (!(std::fabs(g) < 0x1p8f) || (_mm_getcsr() & kDenormalsAreZero) != 0)) return reference(a);
  const int64_t padded = (a.w->cols + 127) / 128 * 128;
  Buffer<uint16_t> xp_buffer;
  uint16_t* xp = xp_buffer.ensure(static_cast<size_t>(a.m * padded));
  const Fp4Order order;
  for (int64_t i = 0; i < a.m; ++i)
    pack_fp4_x_row(order, a.x + i * a.ldx, a.w->cols, padded, xp + i * padded, 32);
  if (!NV && !mxfp4_x_in_range(xp, a.m * padded)) return reference(a);
  if constexpr (NV) {  // MXFP4 takes decoded panels from fewer rows (linear_mxfp4_medium)
    if (a.m >= kQuantPanelMinRowsNvfp4) {
      const Nvfp4Panel source{a.w, _mm512_set1_ps(g * 0x1p120f)};
      return quant_panel_linear(a, xp, padded, {&source, nvfp4_panel, reference});
    }
  }
  const bool wide = wide_decode && a.m == 1 && a.w->row_bytes <= kWideDecodeMaxRowBytes;
  stream(a, a.n0, a.n1, Fp4Tile<NV>{a, xp, padded, _mm512_set1_ps(g * 0x1p120f), reference, wide});
}

void fp8_block_linear(const LinearArgs& a, bool wide_decode) {
  quant::check_linear_args(a, WeightFormat::fp8_block);
  if (a.m == 0 || a.n0 == a.n1) return;
  const PackedWeight& w = *a.w;
  const int64_t k = w.cols, padded = (k + 63) / 64 * 64;
  const Fp8Scales scales(w);
  const Fp8Order order;
  std::vector<float> mult(static_cast<size_t>(k));
  if (a.m < kQuantPanelMinRowsFp8) {
    Buffer<uint16_t> xq_buffer;
    uint16_t* xq = xq_buffer.ensure(static_cast<size_t>(a.m * padded));
    for_each_row_block(w, a.n0, a.n1, [&](int64_t s0, int64_t s1) {
      scales.row(s0, mult.data());
      for (int64_t i = 0; i < a.m; ++i)
        pack_fp8_x_row(order, a.x + i * a.ldx, k, mult.data(), padded, xq + i * padded, 32);
      stream(a, s0, s1, Fp8Tile{a, xq, padded, wide_decode && w.row_bytes <= kWideDecodeMaxRowBytes});
    });
    return;
  }
  using namespace bf16dot_tiles;
  const int64_t steps = padded / 32;
  Buffer<uint16_t> xp_buffer, panel_buffer;
  uint16_t* xp = xp_buffer.ensure(static_cast<size_t>(std::min(a.m, kChunkRows) * padded));
  uint16_t* panels = panel_buffer.ensure(static_cast<size_t>(2 * kGroupCols * padded));
  for (int64_t c0 = 0; c0 < a.m; c0 += kChunkRows) {
    const int64_t rows = std::min(kChunkRows, a.m - c0);
    for_each_row_block(w, a.n0, a.n1, [&](int64_t s0, int64_t s1) {
      scales.row(s0, mult.data());
      pack_tiles(rows, steps, xp, [&](int64_t i, uint16_t* dst, int64_t step_stride) {
        pack_fp8_x_row(order, a.x + (c0 + i) * a.ldx, k, mult.data(), padded, dst, step_stride);
      });
      if (tile_rows(rows, steps) == kWideTileRows)
        decoded_panel_columns<kWideGroupCols, Fp8PanelRows>(
            a, c0, rows, xp, s0, s1, panels, padded, fp8_decode_rows, reference::linear_fp8_block_medium);
      else
        decoded_panel_columns<kGroupCols, Fp8PanelRows>(a, c0, rows, xp, s0, s1, panels, padded,
                                                        fp8_decode_rows, reference::linear_fp8_block_medium);
    });
  }
}
void mxfp4_linear(const LinearArgs& a, bool wide_decode) {
  quant::check_linear_args(a, WeightFormat::mxfp4);
  if (a.m == 0 || a.n0 == a.n1) return;
  if (a.m < kQuantPanelMinRowsMxfp4)
    return fp4_linear<false>(a, WeightFormat::mxfp4, reference::linear_mxfp4_medium, wide_decode);
  using namespace bf16dot_tiles;
  const int64_t k = a.w->cols, padded = (k + 127) / 128 * 128, steps = padded / 32;
  Buffer<uint16_t> xp_buffer, panel_buffer;
  uint16_t* xp = xp_buffer.ensure(static_cast<size_t>(std::min(a.m, kChunkRows) * padded));
  uint16_t* panels = panel_buffer.ensure(static_cast<size_t>(kGroupCols * padded));
  const Fp4Order order;
  for (int64_t c0 = 0; c0 < a.m; c0 += kChunkRows) {
    const int64_t rows = std::min(kChunkRows, a.m - c0);
    pack_tiles(rows, steps, xp, [&](int64_t i, uint16_t* dst, int64_t step_stride) {
      pack_fp4_x_row(order, a.x + (c0 + i) * a.ldx, k, padded, dst, step_stride);
    });
    if (tile_rows(rows, steps) == kWideTileRows)
      decoded_panel_columns<kWideGroupCols, void>(a, c0, rows, xp, a.n0, a.n1, panels, padded,
                                                  mxfp4_decode_rows, reference::linear_mxfp4_medium);
    else
      decoded_panel_columns<kGroupCols, void>(a, c0, rows, xp, a.n0, a.n1, panels, padded, mxfp4_decode_rows,
                                              reference::linear_mxfp4_medium);
  }
}

}  // namespace

void linear_fp8_block_medium(const LinearArgs& a) {
  fp8_block_linear(a, false);
}
void linear_mxfp4_medium(const LinearArgs& a) {
  mxfp4_linear(a, false);
}
void linear_nvfp4_medium(const LinearArgs& a) {
  fp4_linear<true>(a, WeightFormat::nvfp4, reference::linear_nvfp4_medium, false);
}
void linear_fp8_block_medium_wide_decode(const LinearArgs& a) {
  fp8_block_linear(a, true);
}
void linear_mxfp4_medium_wide_decode(const LinearArgs& a) {
  mxfp4_linear(a, true);
}
void linear_nvfp4_medium_wide_decode(const LinearArgs& a) {
  fp4_linear<true>(a, WeightFormat::nvfp4, reference::linear_nvfp4_medium, true);
}

}  // namespace xmoe::kernels::avx512_bf16
