// AVX2 linears over block-quantized weights, bit-identical to linear_quant_reference.cpp (the order is
// described in linear_quant.hpp). The 16 lanes of the shared order are two 8-lane halves (lanes 0–7 and
// 8–15); weights are decoded 16 at a time in registers with their block multiplier folded in.
#include <immintrin.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/cpu/fp4_rows_walk.hpp"
#include "kernels/cpu/l1_blocks.hpp"
#include "kernels/cpu/linear_panels_avx2.hpp"
#include "kernels/cpu/linear_quant.hpp"
#include "kernels/quant/codecs.hpp"
#include "util/buffer.hpp"

namespace xmoe::kernels::avx2 {
namespace {

struct V16 {
  __m256 lo, hi;
};

using panels::reduce16;

// Lanes [0, left) of a 16-lane step as two 8-lane masks (all ones when left ≥ 16).
struct TailMask {
  __m256i lo, hi;
  bool full;
  explicit TailMask(int64_t left) : full(left >= 16) {
    const __m256i n = _mm256_set1_epi32(static_cast<int>(std::min<int64_t>(left, 16)));
    lo = _mm256_cmpgt_epi32(n, _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    hi = _mm256_cmpgt_epi32(n, _mm256_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15));
  }
};

inline V16 load_x(const float* x, const TailMask& m) {
  if (m.full) return {_mm256_loadu_ps(x), _mm256_loadu_ps(x + 8)};
  return {_mm256_maskload_ps(x, m.lo), _mm256_maskload_ps(x + 8, m.hi)};
}

// Block multipliers as f32 per 16 columns; E8M0 / E4M3 codes through a per-call table built by
// quant::fill_scale_table (the reference's expression, so the products are the same bits; compiled at the
// baseline level, so no inline decoder is emitted here with this file's flags).
struct Scales {
  const PackedWeight* w;
  float table[256];
  explicit Scales(const PackedWeight& pw) : w(&pw) {
    if (pw.scale_type != ScaleType::f32) quant::fill_scale_table(pw, table);
  }
  // Scales are looked up by (row base + block counter): no division in the inner loops.
  int64_t row_base(int64_t n) const { return (n / w->block_rows) * w->scale_row_stride; }
  int steps_per_block() const { return w->block_cols / 16; }
  // The scales of rows [b, e) into L2 (a few bytes per row block, but a stream of its own).
  void prefetch(int64_t b, int64_t e) const {
    if (b >= e) return;
    const int64_t size = w->scale_type == ScaleType::f32 ? 4 : 1;
    const char* p = reinterpret_cast<const char*>(w->scales) + row_base(b) * size;
    const int64_t bytes = (row_base(e - 1) + w->scale_row_stride) * size - row_base(b) * size;
    for (int64_t i = 0; i < bytes; i += 64) _mm_prefetch(p + i, _MM_HINT_T1);
  }
  float get(int64_t index) const {
    if (w->scale_type == ScaleType::f32) {
      float s;
      std::memcpy(&s, w->scales + 4 * index, 4);
      return s;
    }
    return table[static_cast<uint8_t>(w->scales[index])];
  }
};

// E4M3 codes (one per lane) → f32 by integer operations (independent of denormals-are-zero).
inline __m256 e4m3_to_ps(__m256i v) {
  const __m256i mag = _mm256_and_si256(v, _mm256_set1_epi32(0x7F));
  const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0x80)), 24);
  const __m256i normal = _mm256_add_epi32(_mm256_slli_epi32(mag, 20), _mm256_set1_epi32(120 << 23));
  const __m256 sub = _mm256_mul_ps(_mm256_cvtepi32_ps(mag), _mm256_set1_ps(1.0f / 512));
  __m256 f = _mm256_blendv_ps(_mm256_castsi256_ps(normal), sub,
                              _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(8), mag)));
  f = _mm256_blendv_ps(f, _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC00000)),
                       _mm256_castsi256_ps(_mm256_cmpeq_epi32(mag, _mm256_set1_epi32(0x7F))));
  return _mm256_or_ps(f, _mm256_castsi256_ps(sign));
}

struct Fp8Rows {
  const uint8_t* data;
  int64_t row_bytes;
  Scales scales;
  void prefetch_scales(int64_t b, int64_t e) const { scales.prefetch(b, e); }
  explicit Fp8Rows(const PackedWeight& w)
      : data(reinterpret_cast<const uint8_t*>(w.data)), row_bytes(w.row_bytes), scales(w) {}
  V16 load(int64_t n, int64_t p, float scale, int64_t k, const TailMask& m) const {
    const uint8_t* src = data + n * row_bytes + p;
    __m128i bytes;
    if (m.full) {
      bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
    } else {
      alignas(16) uint8_t buf[16] = {};
      std::memcpy(buf, src, static_cast<size_t>(k - p));
      bytes = _mm_load_si128(reinterpret_cast<const __m128i*>(buf));
    }
    const __m256 s = _mm256_set1_ps(scale);
    V16 w{_mm256_mul_ps(e4m3_to_ps(_mm256_cvtepu8_epi32(bytes)), s),
          _mm256_mul_ps(e4m3_to_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(bytes, 8))), s)};
    if (!m.full) {  // past k the weight is 0 (not 0 · scale, which is NaN for an infinite scale)
      w.lo = _mm256_and_ps(w.lo, _mm256_castsi256_ps(m.lo));
      w.hi = _mm256_and_ps(w.hi, _mm256_castsi256_ps(m.hi));
    }
    return w;
  }
};

// 16 E2M1 codes from 8 bytes (element 2j in the low nibble of byte j): magnitude through an 8-entry table,
// the sign bit moved to bit 31.
struct Fp4Rows {
  const uint8_t* data;
  int64_t row_bytes;
  Scales scales;
  void prefetch_scales(int64_t b, int64_t e) const { scales.prefetch(b, e); }
  explicit Fp4Rows(const PackedWeight& w)
      : data(reinterpret_cast<const uint8_t*>(w.data)), row_bytes(w.row_bytes), scales(w) {}
  static __m256 decode(__m256i codes) {
    const __m256 lut = _mm256_loadu_ps(quant::kE2M1Values.data());
    const __m256 mag = _mm256_permutevar8x32_ps(lut, _mm256_and_si256(codes, _mm256_set1_epi32(7)));
    const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(codes, _mm256_set1_epi32(8)), 28);
    return _mm256_or_ps(mag, _mm256_castsi256_ps(sign));
  }
  V16 load(int64_t n, int64_t p, float scale, int64_t, const TailMask&) const {  // k is a multiple of 16
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(data + n * row_bytes + p / 2));
    const __m128i lo = _mm_and_si128(b, _mm_set1_epi8(0x0F));
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0x0F));
    const __m128i nib = _mm_unpacklo_epi8(lo, hi);
    const __m256 s = _mm256_set1_ps(scale);
    return {_mm256_mul_ps(decode(_mm256_cvtepu8_epi32(nib)), s),
            _mm256_mul_ps(decode(_mm256_cvtepu8_epi32(_mm_srli_si128(nib, 8))), s)};
  }
};

// MR x rows × NR weight rows starting at n: each step decodes a weight row's 16 values once and feeds them to
// all MR rows (x re-read from L1), which keeps the live registers within AVX2's sixteen.
template <int MR, int NR, class Rows>
void tile(const Rows& w, int64_t n, int64_t k, const float* x, int64_t ldx, float* y, int64_t ldy,
          const char* next = nullptr, int64_t next_bytes = 0) {
  // `next`: the bytes of the tile after this one, prefetched into L2 evenly over this tile's steps (the
  // hardware prefetchers stop at 4 KiB pages, and each of NR short rows would restart cold).
  const int64_t prefetch_step = (next_bytes / ((k + 15) / 16) + 64) / 64 * 64;
  int64_t prefetched = 0;
  __m256 lo[MR][NR], hi[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) lo[i][j] = hi[i][j] = _mm256_setzero_ps();
  int64_t base[NR];
  for (int j = 0; j < NR; ++j) base[j] = w.scales.row_base(n + j);
  const int steps_per_block = w.scales.steps_per_block();
  int64_t block = 0;
  int step = 0;
  for (int64_t p = 0; p < k; p += 16) {
    for (const int64_t end = std::min(next_bytes, prefetched + prefetch_step); prefetched < end;
         prefetched += 64)
      _mm_prefetch(next + prefetched, _MM_HINT_T1);
    const TailMask mask(k - p);
    const int64_t this_block = block;
    if (++step == steps_per_block) {
      step = 0;
      ++block;
    }
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) {
      const V16 wv = w.load(n + j, p, w.scales.get(base[j] + this_block), k, mask);
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i) {
        const V16 xv = load_x(x + i * ldx + p, mask);
        lo[i][j] = _mm256_fmadd_ps(xv.lo, wv.lo, lo[i][j]);
        hi[i][j] = _mm256_fmadd_ps(xv.hi, wv.hi, hi[i][j]);
      }
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) y[i * ldy + n + j] = reduce16(lo[i][j], hi[i][j]);
}

// The decode path's per-block decoders (m ≤ 3): each weight row's block multiplier is folded once per block,
// leaving a handful of vector instructions per 16 weights (the exact tile above decodes every element's
// value and multiplier separately).
//  * FP8: the codes decoded by integer operations as their values × 2^-120 (Fp8Decoder::finish), times the
//    block's multiplier · 2^120 (exact where quant::Fp8DecodeForms::integer_decode), give the product the
//    reference rounds. NaN codes (S.1111.111) are tracked, not decoded: a tile that met one is redone
//    exactly.
//  * FP4: the eight E2M1 magnitudes times the multiplier as one 8-entry table (vpermps), the sign xor-ed in:
//    (−v) · s is −(v · s) bit for bit, so each lane holds the reference's product.
// Up to kByteLookupRows rows these run only where the byte-lookup decoders below do not apply (FP8 blocks of
// an odd multiple of 16 columns, NVFP4 rows of an odd number of 16-column blocks); the panel packers (more
// rows) use them at every shape.
struct Fp8Decoder {
  static constexpr bool kPermuted = false;
  using Block = __m256;
  struct Guard {
    __m128i max = _mm_setzero_si128();
    bool clean() const { return _mm_movemask_epi8(_mm_cmpeq_epi8(max, _mm_set1_epi8(-1))) == 0; }
  };
  static Block block_at(const Scales& sc, int64_t index) { return _mm256_set1_ps(sc.get(index) * 0x1p120f); }
  static V16 decode(const uint8_t* row, int64_t p, Block b, Guard& g) {
    return finish(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + p)), b, g);
  }
  static V16 decode_tail(const uint8_t* row, int64_t p, Block b, Guard& g, int64_t left, const TailMask& m) {
    alignas(16) uint8_t buf[16] = {};
    std::memcpy(buf, row + p, static_cast<size_t>(left));
    const V16 v = finish(_mm_load_si128(reinterpret_cast<const __m128i*>(buf)), b, g);
    return {_mm256_and_ps(v.lo, _mm256_castsi256_ps(m.lo)), _mm256_and_ps(v.hi, _mm256_castsi256_ps(m.hi))};
  }
  // Sign-extended to 16 bits, shifted left by 4 and masked with 0x87F0, a code is the high half of the f32
  // S.0000EEEE.MMM0…, its E4M3 value × 2^-120 exactly (normals and subnormals alike); unpacking with zero
  // words moves it into place. Unpacking works within 128-bit lanes (words 0-3 of each lane to lo, 4-7 to
  // hi), so the codes' dwords are first put in the order 0, 2, 1, 3 (4 codes each): lo gets columns 0..7 and
  // hi 8..15, in order.
  static V16 finish(__m128i raw, Block b, Guard& g) {
    g.max = _mm_max_epu8(g.max, _mm_or_si128(raw, _mm_set1_epi8(-128)));
    const __m256i words = _mm256_and_si256(
        _mm256_slli_epi16(_mm256_cvtepi8_epi16(_mm_shuffle_epi32(raw, _MM_SHUFFLE(3, 1, 2, 0))), 4),
        _mm256_set1_epi16(static_cast<short>(0x87F0)));
    return {_mm256_mul_ps(_mm256_castsi256_ps(_mm256_unpacklo_epi16(_mm256_setzero_si256(), words)), b),
            _mm256_mul_ps(_mm256_castsi256_ps(_mm256_unpackhi_epi16(_mm256_setzero_si256(), words)), b)};
  }
};

// FP4 lanes are kept in a fixed permuted order: the 8 bytes broadcast to every qword, each dword shifted
// right by its own count, leave the physical lanes holding elements {0, 8, 1, 9, 4, 12, 5, 13} (first half)
// and {2, 10, 3, 11, 6, 14, 7, 15} (second half) — the order unpacklo/unpackhi_ps give x in, one pair per
// step shared by the rows. The accumulators are put back in lane order before the reduction, so every lane's
// FMA chain is the one linear_lanes.hpp prescribes.
struct Fp4Decoder {
  static constexpr bool kPermuted = true;
  using Block = __m256;
  struct Guard {
    static bool clean() { return true; }
  };
  // products[c][i] = the E2M1 magnitude i times scale code c's multiplier (the reference's f32 product), with
  // i << 28 xor-ed into its bits: a nibble shifted left by 28 then xor-s in its sign and cancels those bits
  // again, so a lookup is one vpermps, one shift and one xor. Built once per call (256 products of 8).
  alignas(32) float products[256][8];
  __m256i shifts_a = _mm256_setr_epi32(0, 0, 4, 4, 16, 16, 20, 20);
  __m256i shifts_b = _mm256_setr_epi32(8, 8, 12, 12, 24, 24, 28, 28);
  explicit Fp4Decoder(const Scales& sc) {
    const __m256 magnitudes = _mm256_loadu_ps(quant::kE2M1Values.data());
    const __m256i index_bits =
        _mm256_setr_epi32(0, 1 << 28, 2 << 28, 3 << 28, 4 << 28, 5 << 28, 6 << 28, 7 << 28);
    for (int c = 0; c < 256; ++c)
      _mm256_store_ps(products[c], _mm256_xor_ps(_mm256_mul_ps(magnitudes, _mm256_set1_ps(sc.table[c])),
                                                 _mm256_castsi256_ps(index_bits)));
  }
  Block block_at(const Scales& sc, int64_t index) const {
    return _mm256_load_ps(products[static_cast<uint8_t>(sc.w->scales[index])]);
  }
  static __m256 lookup(__m256i nibbles, Block b) {
    return _mm256_xor_ps(_mm256_permutevar8x32_ps(b, nibbles),
                         _mm256_castsi256_ps(_mm256_slli_epi32(nibbles, 28)));
  }
  V16 decode(const uint8_t* row, int64_t p, Block b, Guard&) const {
    int64_t q;
    std::memcpy(&q, row + p / 2, 8);
    const __m256i all = _mm256_set1_epi64x(q);
    return {lookup(_mm256_srlv_epi32(all, shifts_a), b), lookup(_mm256_srlv_epi32(all, shifts_b), b)};
  }
};

// FP4 decode (up to kByteLookupRows rows) by in-lane byte lookups instead of vpermps. An E2M1 value has at
// most two significant bits, so it and its product with a power of two (an MXFP4 block's E8M0 multiplier) are
// exact bf16 numbers, subnormals, inf and NaN included. A step of 32 weights of a row decodes as
//   16 code bytes in both 128-bit lanes → the low nibbles in lane 0, the high ones in lane 1 (one variable
//   shift, one and) → two vpshufb through 16-byte tables (the low and the high byte of each value's bf16
//   image) → two byte unpacks (bf16 words) → four f32 vectors (shift left by 16 for even words, a mask for
//   odd ones),
// about 2.5 single-lane operations per 8 weights where the vpermps decode takes 4 (3 of them shifts and
// permutes). MXFP4 looks its block's products up directly (a table pair per scale code, built once per call
// from the reference's f32 products, so under FTZ they flush as the reference's do); NVFP4's multipliers
// are not powers of two, so it looks up the E2M1 values and multiplies each 16-weight block by its
// multiplier — the reference's f32 product, one vmulps per 8 weights. The lanes come out in a fixed order per
// 32 columns, {0, 4, 8, 12, 1, 5, 9, 13} and {2, 6, 10, 14, 3, 7, 11, 15} for columns 0..15 (the same plus
// 16 for 16..31, so NVFP4's two blocks stay apart); x is put in that order once per call and the
// accumulators back in lane order before the reduction, so each lane's FMA chain is the one
// linear_lanes.hpp prescribes.
struct Fp4ByteTables {
  // MXFP4: [code][0..15] the low bytes, [code][16..31] the high bytes of the code's 16 products. NVFP4: row 0
  // holds the plain E2M1 values' bytes.
  alignas(32) uint8_t bytes[256][32];
  const float* multipliers = nullptr;  // NVFP4: the f32 multiplier of each scale code
  bool exact = true;                   // every looked-up value is its bf16 image
  Fp4ByteTables(const Scales& sc, WeightFormat format) {
    const bool folded = format == WeightFormat::mxfp4;
    if (!folded) multipliers = sc.table;
    __m256 values_lo = _mm256_loadu_ps(quant::kE2M1Values.data());
    __m256 values_hi = _mm256_loadu_ps(quant::kE2M1Values.data() + 8);
    // Hidden from the optimiser: a product by a known ±1 could be folded to ±s, which would skip the flush to
    // zero that the reference's product of a subnormal gets under FTZ.
    asm("" : "+x"(values_lo), "+x"(values_hi));
    // Bytes 2 and 3 of each f32 (its bf16 image) gathered per 128-bit lane, then the lanes' dwords ordered so
    // that one 32-byte store writes the 16 low bytes and then the 16 high bytes.
    const __m256i pick = _mm256_setr_epi8(2, 6, 10, 14, 3, 7, 11, 15, -1, -1, -1, -1, -1, -1, -1, -1, 2, 6,
                                          10, 14, 3, 7, 11, 15, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    __m256i low_halves = _mm256_setzero_si256();
    for (int c = 0; c < (folded ? 256 : 1); ++c) {
      __m256i p0 = _mm256_castps_si256(values_lo), p1 = _mm256_castps_si256(values_hi);
      if (folded) {
        const __m256 s = _mm256_set1_ps(sc.table[c]);
        p0 = _mm256_castps_si256(_mm256_mul_ps(values_lo, s));
        p1 = _mm256_castps_si256(_mm256_mul_ps(values_hi, s));
      }
      low_halves = _mm256_or_si256(low_halves, _mm256_or_si256(p0, p1));
      const __m256i b = _mm256_unpacklo_epi32(_mm256_shuffle_epi8(p0, pick), _mm256_shuffle_epi8(p1, pick));
      _mm256_store_si256(reinterpret_cast<__m256i*>(bytes[c]), _mm256_permutevar8x32_epi32(b, order));
    }
    exact = _mm256_testz_si256(low_halves, _mm256_set1_epi32(0xFFFF)) != 0;
  }
  // Element order of a 32-column step: physical lane q of vector A/B holds column kOrderA/B[q] (+16 for C/D).
  static constexpr int kOrderA[8] = {0, 4, 8, 12, 1, 5, 9, 13};
  static constexpr int kOrderB[8] = {2, 6, 10, 14, 3, 7, 11, 15};
};

// Not inlined: its register allocation is then its own, not a product of the caller's (a few % either way).
// kBlocked: columns [k0, k1) only (multiples of 128 but for k1 = k), the chains starting from acc unless k0
// is 0 and left there unless k1 is k; otherwise all k columns (k0, k1 and acc unused).
template <int MR, int NR, bool kFolded, bool kBlocked>
__attribute__((noinline)) void fp4_bytes_tile(const Fp4ByteTables& t, const uint8_t* data, int64_t row_bytes,
                                              const uint8_t* codes, int64_t code_stride, int64_t k,
                                              const float* xp, float* y, int64_t ldy, int64_t prefetch_ahead,
                                              int64_t k0, int64_t k1, float* acc) {
  if constexpr (!kBlocked) {
    k0 = 0;
    k1 = k;
  }
  const bool resume = kBlocked && k0 > 0;
  const __m256i nibble_shift = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4);
  const __m256i low_nibble = _mm256_set1_epi8(0x0F);
  const __m256i high_word = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  const auto both_lanes = [](const uint8_t* p) {
    return _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  };
  const __m256i value_lo = both_lanes(t.bytes[0]), value_hi = both_lanes(t.bytes[0] + 16);  // NVFP4
  const uint8_t* d[NR];
  const uint8_t* c[NR];
  for (int j = 0; j < NR; ++j) {
    d[j] = data + j * row_bytes;
    c[j] = codes + j * code_stride;
  }
  __m256 acc_a[MR][NR], acc_b[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) {
      acc_a[i][j] = resume ? _mm256_load_ps(acc + ((i * NR + j) * 2) * 8) : _mm256_setzero_ps();
      acc_b[i][j] = resume ? _mm256_load_ps(acc + ((i * NR + j) * 2 + 1) * 8) : _mm256_setzero_ps();
    }
  // 32 columns of every row at byte offset off / 2 from the row pointers.
  const auto step = [&](int64_t off) {
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) {
      __m256i lo_tab = value_lo, hi_tab = value_hi;
      if constexpr (kFolded) {
        const uint8_t* table = t.bytes[c[j][off / 32]];
        lo_tab = both_lanes(table);
        hi_tab = both_lanes(table + 16);
      }
      const __m256i nibbles =
          _mm256_and_si256(_mm256_srlv_epi32(both_lanes(d[j] + off / 2), nibble_shift), low_nibble);
      const __m256i lo = _mm256_shuffle_epi8(lo_tab, nibbles), hi = _mm256_shuffle_epi8(hi_tab, nibbles);
      const __m256i words0 = _mm256_unpacklo_epi8(lo, hi), words1 = _mm256_unpackhi_epi8(lo, hi);
      __m256 wa = _mm256_castsi256_ps(_mm256_slli_epi32(words0, 16));
      __m256 wb = _mm256_castsi256_ps(_mm256_and_si256(words0, high_word));
      __m256 wc = _mm256_castsi256_ps(_mm256_slli_epi32(words1, 16));
      __m256 wd = _mm256_castsi256_ps(_mm256_and_si256(words1, high_word));
      if constexpr (!kFolded) {
        const __m256 s0 = _mm256_set1_ps(t.multipliers[c[j][off / 16]]);
        const __m256 s1 = _mm256_set1_ps(t.multipliers[c[j][off / 16 + 1]]);
        wa = _mm256_mul_ps(wa, s0);
        wb = _mm256_mul_ps(wb, s0);
        wc = _mm256_mul_ps(wc, s1);
        wd = _mm256_mul_ps(wd, s1);
      }
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i) {
        const float* xr = xp + i * k + off;
        acc_a[i][j] = _mm256_fmadd_ps(_mm256_load_ps(xr), wa, acc_a[i][j]);
        acc_b[i][j] = _mm256_fmadd_ps(_mm256_load_ps(xr + 8), wb, acc_b[i][j]);
        acc_a[i][j] = _mm256_fmadd_ps(_mm256_load_ps(xr + 16), wc, acc_a[i][j]);
        acc_b[i][j] = _mm256_fmadd_ps(_mm256_load_ps(xr + 24), wd, acc_b[i][j]);
      }
    }
  };
  // 128 columns (a 64-byte line of each row) per outer step: one prefetch per row and line.
  int64_t off = k0;
  for (; off + 128 <= k1; off += 128) {
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j)
      _mm_prefetch(reinterpret_cast<const char*>(d[j] + off / 2 + prefetch_ahead), _MM_HINT_T1);
#pragma GCC unroll 4
    for (int b = 0; b < 128; b += 32) step(off + b);
  }
  for (; off < k1; off += 32) step(off);
  if (kBlocked && k1 < k) {  // a block of columns before the last: the next one resumes the chains
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NR; ++j) {
        _mm256_store_ps(acc + ((i * NR + j) * 2) * 8, acc_a[i][j]);
        _mm256_store_ps(acc + ((i * NR + j) * 2 + 1) * 8, acc_b[i][j]);
      }
    return;
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) {
      alignas(32) float a[8], b[8], lanes[16];
      _mm256_store_ps(a, acc_a[i][j]);
      _mm256_store_ps(b, acc_b[i][j]);
      for (int q = 0; q < 8; ++q) {
        lanes[Fp4ByteTables::kOrderA[q]] = a[q];
        lanes[Fp4ByteTables::kOrderB[q]] = b[q];
      }
      y[i * ldy + j] = reduce16(_mm256_load_ps(lanes), _mm256_load_ps(lanes + 8));
    }
}

// The byte-lookup decodes take up to kByteLookupRows x rows. With 4 or more, the weight rows go in slices of
// about kByteLookupSliceBytes (well inside a Zen 3 core's 512 KiB L2), each slice run by every group of up to
// 4 x rows in turn: the first group streams it from memory, the others read it from L2, and each group
// decodes it again in registers, which at 4–16 rows costs less than writing and reading back a dequantised
// f32 panel. group.template operator()<MR, NR>(part, i) runs x rows [i, i + MR) (part: a cut to the slice's
// weight rows and to those x and y rows) in tiles of NR weight rows.
constexpr int64_t kByteLookupRows = 16;
constexpr int64_t kByteLookupSliceBytes = 128 << 10;

// FP4: a group of MR x rows whose k columns take more than kGroupWholeBytes (at 4 rows, k above 2048) runs
// over equal blocks of columns (multiples of 128) of at most kGroupBlockBytes, each tile's chains carried
// from block to block, so that the block of x rows stays in L1 beside the weights. One thread capped at AVX2
// on Zen 4 (its CPU time, 2 copies of the weights, alternated builds), 2048 × 4096 and 2048 × 7168 at 8 and
// 16 rows: MXFP4 49-51 → 57-67 GFLOP/s (4096 × 2048: 65-69), NVFP4 47-51 → 48-56; blocks of 32 KiB read 2-8 %
// slower. FP8's decode costs more per weight and keeps whole rows: blocks of its path gained 0-5 %.
constexpr int64_t kGroupWholeBytes = 32 << 10;
constexpr int64_t kGroupBlockBytes = 16 << 10;

template <class Group>
void slices_by_groups(const LinearArgs& a, int64_t bytes_per_row, Group&& group) {
  const int64_t slice = a.m <= 3 ? a.n1 - a.n0 : std::max<int64_t>(8, kByteLookupSliceBytes / bytes_per_row);
  for (int64_t n0 = a.n0; n0 < a.n1; n0 += slice)
    for (int64_t i = 0; i < a.m; i += 4) {
      const LinearArgs part =
          quant::args_part(a, i, std::min<int64_t>(4, a.m - i), n0, std::min(a.n1, n0 + slice) - n0);
      switch (part.m) {
        case 1:
          group.template operator()<1, 4>(part, i);
          break;
        case 2:
          group.template operator()<2, 2>(part, i);
          break;
        case 3:
          group.template operator()<3, 1>(part, i);
          break;
        default:
          group.template operator()<4, 1>(part, i);
          break;
      }
    }
}

template <bool kFolded>
void fp4_bytes_rows(const Fp4ByteTables& t, const LinearArgs& a) {
  const PackedWeight& w = *a.w;
  const int64_t k = w.cols;  // a multiple of 32
  // 64-byte aligned, k a multiple of 32: aligned loads in the tile.
  Buffer<float> xp_buffer;
  float* xp = xp_buffer.ensure(static_cast<size_t>(a.m * k));
  for (int64_t i = 0; i < a.m; ++i)
    for (int64_t p = 0; p < k; p += 32)
      for (int q = 0; q < 8; ++q) {
        float* out = xp + i * k + p;
        const float* in = a.x + i * a.ldx + p;
        out[q] = in[Fp4ByteTables::kOrderA[q]];
        out[8 + q] = in[Fp4ByteTables::kOrderB[q]];
        out[16 + q] = in[16 + Fp4ByteTables::kOrderA[q]];
        out[24 + q] = in[16 + Fp4ByteTables::kOrderB[q]];
      }
  Buffer<float> acc_buffer;  // MR · 16 floats per weight row of a part
  slices_by_groups(
      a, w.row_bytes + w.scale_row_stride, [&]<int MR, int NR>(const LinearArgs& part, int64_t i) {
        const int64_t block =
            units_per_block(k, MR * int64_t(sizeof(float)), kGroupWholeBytes, kGroupBlockBytes, 128);
        float* acc =
            block < k ? acc_buffer.ensure(static_cast<size_t>((part.n1 - part.n0) * MR * 16)) : nullptr;
        for (int64_t k0 = 0; k0 < k; k0 += block)
          walk_fp4_rows<NR>(
              part, [&]<int R>(const uint8_t* data, const uint8_t* codes, float* y, int64_t ahead) {
                const int64_t n = y - part.y - part.n0;  // the tile's first weight row within the part
                const auto tile =
                    acc ? fp4_bytes_tile<MR, R, kFolded, true> : fp4_bytes_tile<MR, R, kFolded, false>;
                tile(t, data, w.row_bytes, codes, w.scale_row_stride, k, xp + i * k, y, a.ldy, ahead, k0,
                     std::min(k, k0 + block), acc ? acc + n * MR * 16 : nullptr);
              });
      });
}

// Whether the byte-table decode took the call: m ≤ kByteLookupRows, k a multiple of 32, every looked-up value
// exact.
bool fp4_by_bytes(const Scales& sc, const LinearArgs& a) {
  if (a.w->cols % 32 != 0 || a.m > kByteLookupRows) return false;
  const Fp4ByteTables t(sc, a.w->format);
  if (!t.exact) return false;
  if (a.w->format == WeightFormat::mxfp4)
    fp4_bytes_rows<true>(t, a);
  else
    fp4_bytes_rows<false>(t, a);
  return true;
}

// The decode tile: MR (< 4) x rows × NR weight rows, walking k block by block so each row's multiplier is
// prepared once per block. Returns false when the decoder met a code it leaves to the exact path.
template <int MR, int NR, class Dec>
bool fast_tile(const Dec& dec, const Scales& sc, const uint8_t* data, int64_t row_bytes, int64_t n, int64_t k,
               const float* x, int64_t ldx, float* y, int64_t ldy, const char* next, int64_t next_bytes) {
  const int64_t prefetch_step = (next_bytes / ((k + 15) / 16) + 64) / 64 * 64;
  int64_t prefetched = 0;
  __m256 lo[MR][NR], hi[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) lo[i][j] = hi[i][j] = _mm256_setzero_ps();
  int64_t base[NR];
  const uint8_t* row[NR];
  for (int j = 0; j < NR; ++j) {
    base[j] = sc.row_base(n + j);
    row[j] = data + (n + j) * row_bytes;
  }
  typename Dec::Guard guard;
  const int64_t block_cols = sc.w->block_cols;
  int64_t block = 0;
  const auto step = [&](int64_t p, const typename Dec::Block* mult, const TailMask& mask, int64_t left) {
    for (const int64_t end = std::min(next_bytes, prefetched + prefetch_step); prefetched < end;
         prefetched += 64)
      _mm_prefetch(next + prefetched, _MM_HINT_T1);
    V16 wv[NR];
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) {
      if constexpr (Dec::kPermuted)
        wv[j] = dec.decode(row[j], p, mult[j], guard);
      else
        wv[j] = mask.full ? dec.decode(row[j], p, mult[j], guard)
                          : dec.decode_tail(row[j], p, mult[j], guard, left, mask);
    }
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {
      V16 xv = load_x(x + i * ldx + p, mask);
      if constexpr (Dec::kPermuted) xv = {_mm256_unpacklo_ps(xv.lo, xv.hi), _mm256_unpackhi_ps(xv.lo, xv.hi)};
#pragma GCC unroll 4
      for (int j = 0; j < NR; ++j) {
        lo[i][j] = _mm256_fmadd_ps(xv.lo, wv[j].lo, lo[i][j]);
        hi[i][j] = _mm256_fmadd_ps(xv.hi, wv[j].hi, hi[i][j]);
      }
    }
  };
  const TailMask full(16);
  for (int64_t p0 = 0; p0 < k; p0 += block_cols, ++block) {
    typename Dec::Block mult[NR];
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) mult[j] = dec.block_at(sc, base[j] + block);
    const int64_t pe = std::min(k, p0 + block_cols);
    int64_t p = p0;
    for (; p + 16 <= pe; p += 16) step(p, mult, full, 16);
    if (p < pe) step(p, mult, TailMask(pe - p), pe - p);  // FP8's k tail (FP4's k is a multiple of 16)
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) {
      __m256 l = lo[i][j], h = hi[i][j];
      if constexpr (Dec::kPermuted) {  // lanes back in order: 0..7 and 8..15
        l = _mm256_shuffle_ps(lo[i][j], hi[i][j], _MM_SHUFFLE(2, 0, 2, 0));
        h = _mm256_shuffle_ps(lo[i][j], hi[i][j], _MM_SHUFFLE(3, 1, 3, 1));
      }
      y[i * ldy + n + j] = reduce16(l, h);
    }
  return guard.clean();
}

// FP8 decode (up to kByteLookupRows rows) for blocks of a multiple of 32 columns, 32 columns per step: the
// integer decode of Fp8Decoder::finish reached by in-lane unpacks. The 32 codes' qwords put in the order 0,
// 2, 1, 3, a code unpacked above a zero byte (c << 8), shifted right arithmetically by 4 and masked with
// 0x87F0 is the high half of the f32 S.0000EEEE.MMM0… (its value × 2^-120), and unpacking those words above
// zero words gives four f32 vectors holding columns {0-3, 8-11}, {4-7, 12-15}, {16-19, 24-27}, {20-23, 28-31}
// — two accumulators per row whose lanes are columns {0-3, 8-11} and {4-7, 12-15} mod 16 (x is put in that
// order once per call, and the halves swapped back before the reduction). One lane-crossing permute per 32
// codes where finish takes two, no sign extension, and one prefetch per row and 64 columns. Returns false
// when a NaN code was met (the caller redoes the tile exactly). Not inlined, as fp4_bytes_tile.
//
// ScaledX (one x row; the NR rows in one block of rows; quant::Fp8DecodeForms::scaled_x for the call's x and
// rows): the multipliers are powers of two, so v · s is exact and x · (v · s) the same real number as (x · s
// · 2^120) · (v · 2^-120), which stays exact over the call's x; the multiplier goes onto the x vectors, 4
// products per 32 columns instead of 4 per row (as linear_quant_avx512.cpp's fp8_tile).
//
// Guarded: false for rows known to hold no NaN code (PackedWeight::rows_nan_free), which skip the check.
template <int MR, int NR, bool ScaledX = false, bool Guarded = true>
__attribute__((noinline)) bool fp8_bytes_tile(const Scales& sc, const uint8_t* data, int64_t row_bytes,
                                              int64_t n, int64_t k, const float* xp, float* y, int64_t ldy,
                                              int64_t prefetch_ahead) {
  const __m256i magnitude_bits = _mm256_set1_epi16(static_cast<short>(0x87F0));
  const __m256i zero = _mm256_setzero_si256();
  const uint8_t* d[NR];
  int64_t base[NR];
  for (int j = 0; j < NR; ++j) {
    d[j] = data + (n + j) * row_bytes;
    base[j] = sc.row_base(n + j);
  }
  __m256 acc_a[MR][NR], acc_b[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc_a[i][j] = acc_b[i][j] = _mm256_setzero_ps();
  __m256i guard = _mm256_setzero_si256();
  // Columns p..p + 31 of every row, whose codes are at rows[j] + at.
  static_assert(!ScaledX || MR == 1);
  const auto step = [&](int64_t p, const __m256* mult, const uint8_t* const* rows, int64_t at) {
    __m256 scaled[4];  // ScaledX: the x row's 32 columns times the multiplier
    if constexpr (ScaledX)
      for (int q = 0; q < 4; ++q) scaled[q] = _mm256_mul_ps(_mm256_load_ps(xp + p + 8 * q), mult[0]);
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) {
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[j] + at));
      if constexpr (Guarded) guard = _mm256_max_epu8(guard, _mm256_or_si256(raw, _mm256_set1_epi8(-128)));
      const __m256i ordered = _mm256_permute4x64_epi64(raw, _MM_SHUFFLE(3, 1, 2, 0));
      const __m256i w0 =
          _mm256_and_si256(_mm256_srai_epi16(_mm256_unpacklo_epi8(zero, ordered), 4), magnitude_bits);
      const __m256i w1 =
          _mm256_and_si256(_mm256_srai_epi16(_mm256_unpackhi_epi8(zero, ordered), 4), magnitude_bits);
      // The weights' values × 2^-120, times the multiplier unless it goes onto x.
      const auto weight = [&](__m256i words, bool high) {
        const __m256 v = _mm256_castsi256_ps(high ? _mm256_unpackhi_epi16(zero, words)
                                                  : _mm256_unpacklo_epi16(zero, words));
        return ScaledX ? v : _mm256_mul_ps(v, mult[j]);
      };
      const __m256 wa = weight(w0, false), wb = weight(w0, true), wc = weight(w1, false),
                   wd = weight(w1, true);
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i) {
        const float* xr = xp + i * ((k + 31) / 32 * 32) + p;
        const auto xv = [&](int q) { return ScaledX ? scaled[q] : _mm256_load_ps(xr + 8 * q); };
        acc_a[i][j] = _mm256_fmadd_ps(xv(0), wa, acc_a[i][j]);
        acc_b[i][j] = _mm256_fmadd_ps(xv(1), wb, acc_b[i][j]);
        acc_a[i][j] = _mm256_fmadd_ps(xv(2), wc, acc_a[i][j]);
        acc_b[i][j] = _mm256_fmadd_ps(xv(3), wd, acc_b[i][j]);
      }
    }
  };
  const int64_t block_cols = sc.w->block_cols;  // a multiple of 32
  int64_t block = 0;
  for (int64_t p0 = 0; p0 < k; p0 += block_cols, ++block) {
    __m256 mult[NR];
    for (int j = 0; j < (ScaledX ? 1 : NR); ++j) mult[j] = Fp8Decoder::block_at(sc, base[j] + block);
    const int64_t pe = std::min(k, p0 + block_cols);
    int64_t p = p0;
    for (; p + 64 <= pe; p += 64) {
#pragma GCC unroll 4
      for (int j = 0; j < NR; ++j)
        _mm_prefetch(reinterpret_cast<const char*>(d[j] + p + prefetch_ahead), _MM_HINT_T1);
      step(p, mult, d, p);
      step(p + 32, mult, d, p + 32);
    }
    for (; p + 32 <= pe; p += 32) step(p, mult, d, p);
    if (p < pe) {  // the k tail: codes past k read as 0 (+0 times a finite multiplier), x there is 0
      alignas(32) uint8_t tail[NR][32] = {};
      const uint8_t* rows[NR];
      for (int j = 0; j < NR; ++j) {
        std::memcpy(tail[j], d[j] + p, static_cast<size_t>(pe - p));
        rows[j] = tail[j];
      }
      step(p, mult, rows, 0);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j)
      y[i * ldy + n + j] = reduce16(_mm256_permute2f128_ps(acc_a[i][j], acc_b[i][j], 0x20),
                                    _mm256_permute2f128_ps(acc_a[i][j], acc_b[i][j], 0x31));
  return _mm_movemask_epi8(
             _mm_cmpeq_epi8(_mm_max_epu8(_mm256_castsi256_si128(guard), _mm256_extracti128_si256(guard, 1)),
                            _mm_set1_epi8(-1))) == 0;
}

// The decode paths' walk over weight rows [a.n0, a.n1): the first two tiles prefetched, tiles of NR rows and
// then single rows, each NR-row tile told which bytes follow the next one (their scales prefetched here).
// fast.template operator()<R>(n, next, next_bytes) decodes a tile of R rows from row n and returns false when
// it met a code it leaves to the exact path, which then redoes the tile.
template <int MR, int NR, class Rows, class Fast>
void walk_tiles(const Rows& exact, const LinearArgs& a, Fast&& fast) {
  const int64_t k = a.w->cols;
  const auto rows_bytes = [&](int64_t b, int64_t e) { return (e - b) * exact.row_bytes; };
  const auto row_ptr = [&](int64_t r) {
    return reinterpret_cast<const char*>(exact.data + r * exact.row_bytes);
  };
  for (int64_t b = 0; b < rows_bytes(a.n0, std::min(a.n1, a.n0 + 2 * NR)); b += 64)
    _mm_prefetch(row_ptr(a.n0) + b, _MM_HINT_T1);
  const auto run = [&]<int R>(int64_t n, const char* next, int64_t next_bytes) {
    if (!fast.template operator()<R>(n, next, next_bytes)) tile<MR, R>(exact, n, k, a.x, a.ldx, a.y, a.ldy);
  };
  int64_t n = a.n0;
  for (; n + NR <= a.n1; n += NR) {
    const int64_t next_begin = std::min(a.n1, n + 2 * NR), next_end = std::min(a.n1, n + 3 * NR);
    exact.prefetch_scales(next_begin, next_end);
    run.template operator()<NR>(n, row_ptr(next_begin), rows_bytes(next_begin, next_end));
  }
  for (; n < a.n1; ++n) run.template operator()<1>(n, nullptr, 0);
}

// Decode with the per-block decoders; a tile the decoder declines is redone by the exact tile over `exact`.
template <int MR, int NR, class Dec, class Rows>
void stream_rows_fast(const Dec& dec, const Rows& exact, const LinearArgs& a) {
  walk_tiles<MR, NR>(exact, a, [&]<int R>(int64_t n, const char* next, int64_t next_bytes) {
    return fast_tile<MR, R>(dec, exact.scales, exact.data, exact.row_bytes, n, a.w->cols, a.x, a.ldx, a.y,
                            a.ldy, next, next_bytes);
  });
}

// FP8 byte-lookup decode of rows [a.n0, a.n1) for MR x rows (a.x, a.y: the group's first row) whose permuted
// copy is xg; each row prefetches the row two tiles below it.
// scaled_x: quant::Fp8DecodeForms::scaled_x for the call (the tiles of one x row whose rows share a block of
// rows take the ScaledX form). Rows whose flags say they hold no NaN code skip the check; rows found clean
// are recorded.
template <int MR, int NR>
void fp8_bytes_walk(const Fp8Rows& exact, const LinearArgs& a, const float* xg, bool scaled_x) {
  walk_tiles<MR, NR>(exact, a, [&]<int R>(int64_t n, const char* next, int64_t) {
    const int64_t ahead = next ? next - reinterpret_cast<const char*>(exact.data + n * exact.row_bytes) : 0;
    const auto checked = [&]<bool ScaledX>() {
      return a.w->decode_rows_nan_checked(n, R, [&]<bool Guarded>() {
        return fp8_bytes_tile<MR, R, ScaledX, Guarded>(exact.scales, exact.data, exact.row_bytes, n,
                                                       a.w->cols, xg, a.y, a.ldy, ahead);
      });
    };
    if constexpr (MR == 1)
      if (scaled_x && exact.scales.row_base(n) == exact.scales.row_base(n + R - 1))
        return checked.template operator()<true>();
    return checked.template operator()<false>();
  });
}

// Up to kByteLookupRows x rows, in slices and groups (slices_by_groups).
// scaled_x: quant::Fp8DecodeForms::scaled_x for the call.
void fp8_bytes_rows(const Fp8Rows& exact, const LinearArgs& a, bool scaled_x) {
  const int64_t k = a.w->cols, kp = (k + 31) / 32 * 32;
  // x rows in the tile's lane order, zero past k (64-byte aligned: aligned loads in the tile).
  Buffer<float> xp_buffer;
  float* xp = xp_buffer.ensure_zero(static_cast<size_t>(a.m * kp));
  for (int64_t i = 0; i < a.m; ++i)
    for (int64_t p = 0; p < k; ++p) {
      const int64_t c = p % 32, half = c / 16, q = c % 16;  // column q of a 16-column half
      xp[i * kp + p - c + half * 16 + (q % 8 < 4 ? 0 : 8) + (q / 8) * 4 + q % 4] = a.x[i * a.ldx + p];
    }
  slices_by_groups(a, exact.row_bytes, [&]<int MR, int NR>(const LinearArgs& part, int64_t i) {
    fp8_bytes_walk<MR, NR>(exact, part, xp + i * kp, scaled_x);
  });
}

template <class Dec, class Rows>
void stream_fast(const Dec& dec, const Rows& w, const LinearArgs& a) {
  switch (a.m) {
    case 1:
      return stream_rows_fast<1, 4>(dec, w, a);
    case 2:
      return stream_rows_fast<2, 2>(dec, w, a);
    default:
      return stream_rows_fast<3, 1>(dec, w, a);
  }
}

template <int MR, int NR, class Rows>
void stream_rows(const Rows& w, const LinearArgs& a) {
  const int64_t k = a.w->cols;
  const auto rows_bytes = [&](int64_t b, int64_t e) { return (e - b) * w.row_bytes; };
  const auto row_ptr = [&](int64_t r) { return reinterpret_cast<const char*>(w.data + r * w.row_bytes); };
  for (int64_t b = 0; b < rows_bytes(a.n0, std::min(a.n1, a.n0 + NR)); b += 64)
    _mm_prefetch(row_ptr(a.n0) + b, _MM_HINT_T1);
  int64_t n = a.n0;
  for (; n + NR <= a.n1; n += NR) {
    const int64_t next_end = std::min(a.n1, n + 2 * NR);
    w.prefetch_scales(n + NR, next_end);
    tile<MR, NR>(w, n, k, a.x, a.ldx, a.y, a.ldy, row_ptr(n + NR), rows_bytes(n + NR, next_end));
  }
  for (; n < a.n1; ++n) tile<MR, 1>(w, n, k, a.x, a.ldx, a.y, a.ldy);
}

// Many rows (prefill, batches of 4 or more): panels::linear_panels, the BF16 path's panel GEMM, over panels
// of weight rows dequantised here once per panel to the reference's f32 values, by the decode path's
// decoders (Fp8Decoder, Fp4Decoder) where they apply. Each packer names its rows' codes (`span`), which the
// tiles over the panel before prefetch.

// FP8: the integer decode (Fp8Decoder) where quant::Fp8DecodeForms::integer_decode; a panel in which that met
// a NaN code is decoded again by the exact conversion (Fp8Rows::load), which every panel takes otherwise.
struct Fp8PanelPacker {
  const Fp8Rows& w;
  int64_t k;
  bool integer_decode;
  WeightSpan span(int64_t j, int rows) const { return rows_span(w.data, w.row_bytes, w.row_bytes, j, rows); }
  void operator()(int64_t j, int rows, float* panel) const {
    if (integer_decode) {
      Fp8Decoder::Guard guard;
      pack(j, rows, panel, [&](int64_t n, int64_t p, int64_t index, const TailMask& mask) {
        const uint8_t* row = w.data + n * w.row_bytes;
        const Fp8Decoder::Block b = Fp8Decoder::block_at(w.scales, index);
        return mask.full ? Fp8Decoder::decode(row, p, b, guard)
                         : Fp8Decoder::decode_tail(row, p, b, guard, k - p, mask);
      });
      if (guard.clean()) {
        w.scales.w->mark_rows_nan_free(j, rows);  // whole rows read: the decode tiles may trust them later
        return;
      }
    }
    pack(j, rows, panel, [&](int64_t n, int64_t p, int64_t index, const TailMask& mask) {
      return w.load(n, p, w.scales.get(index), k, mask);
    });
  }
  // decode(n, p, scale index, mask): the 16 weights of row n at column p, zeros past k.
  template <class Decode>
  void pack(int64_t j, int rows, float* panel, Decode&& decode) const {
    const int steps_per_block = w.scales.steps_per_block();
    const int64_t steps = (k + 15) / 16;
    for (int r = 0; r < rows; ++r) {
      const int64_t n = j + r, base = w.scales.row_base(n);
      for (int64_t s = 0, p = 0; p < k; ++s, p += 16) {
        const V16 v = decode(n, p, base + s / steps_per_block, TailMask(k - p));
        panels::store_panel_step(panel, steps, s, r, v.lo, v.hi);
      }
    }
  }
};

// FP4 (k a multiple of 16): Fp4Decoder's lookups, then its lanes back in order ({0, 8, 1, 9, 4, 12, 5, 13}
// and {2, 10, 3, 11, 6, 14, 7, 15}: elements 0..7 are lanes 0 and 2 of each 128-bit half of both, 8..15
// lanes 1 and 3).
struct Fp4PanelPacker {
  const Fp4Decoder& dec;
  const Fp4Rows& w;
  int64_t k;
  WeightSpan span(int64_t j, int rows) const { return rows_span(w.data, w.row_bytes, w.row_bytes, j, rows); }
  void operator()(int64_t j, int rows, float* panel) const {
    Fp4Decoder::Guard guard;
    for (int r = 0; r < rows; ++r) {
      const int64_t n = j + r, base = w.scales.row_base(n);
      const uint8_t* row = w.data + n * w.row_bytes;
      const int steps_per_block = w.scales.steps_per_block();
      const int64_t steps = k / 16;
      for (int64_t s = 0, p = 0; p < k; ++s, p += 16) {
        const V16 v = dec.decode(row, p, dec.block_at(w.scales, base + s / steps_per_block), guard);
        panels::store_panel_step(panel, steps, s, r, _mm256_shuffle_ps(v.lo, v.hi, _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm256_shuffle_ps(v.lo, v.hi, _MM_SHUFFLE(3, 1, 3, 1)));
      }
    }
  }
};

template <class Rows>
void linear(const LinearArgs& a, WeightFormat format) {
  quant::check_linear_args(a, format);
  if (a.m == 0 || a.n0 == a.n1) return;
  const Rows w(*a.w);
  if constexpr (std::is_same_v<Rows, Fp4Rows>) {
    if (fp4_by_bytes(w.scales, a)) return;
    if (a.m <= 3) return stream_fast(Fp4Decoder(w.scales), w, a);
  } else {
    // Scans every block scale of the rows: once per call.
    const quant::Fp8DecodeForms forms = quant::fp8_decode_forms(a);
    const bool integer_decode = forms.integer_decode;
    if (integer_decode && a.m <= kByteLookupRows && a.w->block_cols % 32 == 0)
      return fp8_bytes_rows(w, a, forms.scaled_x);
    if (integer_decode && a.m <= 3) return stream_fast(Fp8Decoder{}, w, a);
    if (a.m > 3)
      return panels::linear_panels(a.x, a.ldx, a.m, a.w->cols, a.n0, a.n1, a.y, a.ldy,
                                   Fp8PanelPacker{w, a.w->cols, integer_decode});
  }
  switch (a.m) {
    case 1:
      return stream_rows<1, 4>(w, a);
    case 2:
      return stream_rows<2, 2>(w, a);
    case 3:
      return stream_rows<3, 1>(w, a);
    default:
      break;
  }
  if constexpr (std::is_same_v<Rows, Fp4Rows>) {
    const Fp4Decoder dec(w.scales);
    panels::linear_panels(a.x, a.ldx, a.m, a.w->cols, a.n0, a.n1, a.y, a.ldy,
                          Fp4PanelPacker{dec, w, a.w->cols});
  }
}

}  // namespace

void linear_fp8_block(const LinearArgs& args) {
  linear<Fp8Rows>(args, WeightFormat::fp8_block);
}
void linear_mxfp4(const LinearArgs& args) {
  linear<Fp4Rows>(args, WeightFormat::mxfp4);
}
void linear_nvfp4(const LinearArgs& args) {
  linear<Fp4Rows>(args, WeightFormat::nvfp4);
}

}  // namespace xmoe::kernels::avx2
