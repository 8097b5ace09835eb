// AVX-512 linears over block-quantized weights, bit-identical to linear_quant_reference.cpp (the order is
// described in linear_quant.hpp): weights are decoded 16 at a time in registers, their block multiplier
// folded in with one f32 product, and each output is a 16-lane FMA chain over k reduced by the fixed tree.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/cpu/fp4_rows_walk.hpp"
#include "kernels/cpu/linear_panels_avx512.hpp"
#include "kernels/cpu/linear_quant.hpp"
#include "kernels/quant/codecs.hpp"

namespace xmoe::kernels::avx512 {
namespace {

using panels::reduce16;

inline __mmask16 tail_mask(int64_t left) {
  return left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1);
}

// Block multipliers as f32, looked up per 16 columns: f32 scales directly, E8M0 / E4M3 codes through a table
// built once per call by quant::fill_scale_table (the reference's expression, so the products are the same
// bits; compiled at the baseline level, so no inline decoder is emitted here with this file's flags).
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

// 16 E4M3 codes → their values × 2^-8, exactly: the code's bits moved into binary16 position (S.EEEE.MMM →
// S.0EEEE.MMM0000000) are the same number with the exponent bias 15 instead of 7, and the F16C conversion is
// exact for every half, subnormals included (it ignores denormals-are-zero). 0x7F/0xFF become NaN.
inline __m512 e4m3_to_ps_times_2m8(__m128i bytes) {
  const __m256i b = _mm256_cvtepu8_epi16(bytes);
  const __m256i mag = _mm256_and_si256(b, _mm256_set1_epi16(0x7F));
  const __m256i half = _mm256_or_si256(_mm256_slli_epi16(mag, 7),
                                       _mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x80)), 8));
  return _mm512_mask_mov_ps(_mm512_maskz_cvtph_ps(0xffff, half),
                            _mm256_cmpeq_epi16_mask(mag, _mm256_set1_epi16(0x7F)),
                            _mm512_castsi512_ps(_mm512_set1_epi32(0x7FC00000)));
}

struct Fp8Rows {
  const uint8_t* data;
  int64_t row_bytes;
  Scales scales;
  void prefetch_scales(int64_t b, int64_t e) const { scales.prefetch(b, e); }
  explicit Fp8Rows(const PackedWeight& w)
      : data(reinterpret_cast<const uint8_t*>(w.data)), row_bytes(w.row_bytes), scales(w) {}
  __m512 load(int64_t n, int64_t p, float scale, __mmask16 mask) const {
    const __m128i bytes = _mm_maskz_loadu_epi8(mask, data + n * row_bytes + p);
    const __m512 v = e4m3_to_ps_times_2m8(bytes);
    // (value · 2^-8) · (scale · 2^8) is the same real number as value · scale, so it rounds to the same f32,
    // as long as scale · 2^8 is exact: only scales ≥ 2^119 (or NaN) take the two-step product.
    if (__builtin_expect(std::fabs(scale) < 0x1p119f, 1))
      return _mm512_maskz_mul_ps(mask, v, _mm512_set1_ps(scale * 256.0f));
    return _mm512_maskz_mul_ps(mask, _mm512_mul_ps(v, _mm512_set1_ps(256.0f)), _mm512_set1_ps(scale));
  }
};

// 16 E2M1 codes from 8 bytes, element 2j in the low nibble of byte j, decoded through a 16-entry table.
struct Fp4Rows {
  const uint8_t* data;
  int64_t row_bytes;
  Scales scales;
  __m512 lut;
  void prefetch_scales(int64_t b, int64_t e) const { scales.prefetch(b, e); }
  explicit Fp4Rows(const PackedWeight& w)
      : data(reinterpret_cast<const uint8_t*>(w.data)),
        row_bytes(w.row_bytes),
        scales(w),
        lut(_mm512_loadu_ps(quant::kE2M1Values.data())) {}
  __m512 load(int64_t n, int64_t p, float scale, __mmask16) const {  // k is a multiple of 16: no tail
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(data + n * row_bytes + p / 2));
    const __m128i lo = _mm_and_si128(b, _mm_set1_epi8(0x0F));
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0x0F));
    const __m512i idx = _mm512_maskz_cvtepu8_epi32(0xffff, _mm_unpacklo_epi8(lo, hi));
    return _mm512_mul_ps(_mm512_maskz_permutexvar_ps(0xffff, idx, lut), _mm512_set1_ps(scale));
  }
};

// MR x rows × NR weight rows starting at n; each step decodes NR weight vectors once for all MR rows.
template <int MR, int NR, class Rows>
void tile(const Rows& w, int64_t n, int64_t k, const float* x, int64_t ldx, float* y, int64_t ldy,
          const char* next = nullptr, int64_t next_bytes = 0) {
  // `next`: the bytes of the tile after this one, prefetched into L2 evenly over this tile's steps (the
  // hardware prefetchers stop at 4 KiB pages, and each of NR short rows would restart cold).
  const int64_t prefetch_step = (next_bytes / ((k + 15) / 16) + 64) / 64 * 64;
  int64_t prefetched = 0;
  __m512 acc[MR][NR];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
  int64_t base[NR];
  for (int j = 0; j < NR; ++j) base[j] = w.scales.row_base(n + j);
  const int steps_per_block = w.scales.steps_per_block();
  int64_t block = 0;
  int step = 0;
  for (int64_t p = 0; p < k; p += 16) {
    for (const int64_t end = std::min(next_bytes, prefetched + prefetch_step); prefetched < end;
         prefetched += 64)
      _mm_prefetch(next + prefetched, _MM_HINT_T1);
    const __mmask16 mask = tail_mask(k - p);
    __m512 wv[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) wv[j] = w.load(n + j, p, w.scales.get(base[j] + block), mask);
    if (++step == steps_per_block) {
      step = 0;
      ++block;
    }
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {
      const __m512 xv = _mm512_maskz_loadu_ps(mask, x + i * ldx + p);
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) y[i * ldy + n + j] = reduce16(acc[i][j]);
}

// Decode: MR (≤ 4) rows, the weight streams once, NR rows at a time.
template <int MR, int NR, class Rows>
void stream_rows(const Rows& w, const LinearArgs& a) {
  const int64_t k = a.w->cols;
  const auto rows_bytes = [&](int64_t b, int64_t e) { return (e - b) * w.row_bytes; };
  const auto row_ptr = [&](int64_t r) { return reinterpret_cast<const char*>(w.data + r * w.row_bytes); };
  for (int64_t b = 0; b < rows_bytes(a.n0, std::min(a.n1, a.n0 + 2 * NR)); b += 64)
    _mm_prefetch(row_ptr(a.n0) + b, _MM_HINT_T1);
  int64_t n = a.n0;
  for (; n + NR <= a.n1; n += NR) {
    const int64_t next_begin = std::min(a.n1, n + 2 * NR), next_end = std::min(a.n1, n + 3 * NR);
    w.prefetch_scales(next_begin, next_end);
    tile<MR, NR>(w, n, k, a.x, a.ldx, a.y, a.ldy, row_ptr(next_begin), rows_bytes(next_begin, next_end));
  }
  for (; n < a.n1; ++n) tile<MR, 1>(w, n, k, a.x, a.ldx, a.y, a.ldy);
}

// The decode path's per-block decoders (groups of m ≤ 4 rows): the block multiplier is folded once per block
// and weight row, leaving a handful of vector instructions per 16 weights.
//  * FP8: a code sign-extended to 32 bits, shifted left by 20 and masked with 0x87F00000 is the f32 whose
//    bits are S.0000EEEE.MMM0…: the E4M3 value × 2^-120 exactly, normals (exponent bias 127 instead of 7) and
//    subnormals (an f32 subnormal with the same mantissa) alike. Times the block multiplier · 2^120 it is
//    the reference's product where quant::Fp8DecodeForms::integer_decode. NaN codes are tracked, not decoded.
//  * FP4: see Fp4Decoder.

struct Fp8Decoder {
  using Block = __m512;
  // NaN codes (S.1111.111) are tracked instead of decoded: the caller redoes a tile that had one by the exact
  // path. A code is NaN when (code | 0x80) == 0xFF, the largest byte, so a running maximum of that finds
  // them.
  struct Guard {
    __m128i max16 = _mm_setzero_si128();
    __m256i max32 = _mm256_setzero_si256();
    void note(__m128i raw) { max16 = _mm_max_epu8(max16, _mm_or_si128(raw, _mm_set1_epi8(-128))); }
    void note(__m256i raw) { max32 = _mm256_max_epu8(max32, _mm256_or_si256(raw, _mm256_set1_epi8(-128))); }
    bool clean() const {
      const __m128i m = _mm_max_epu8(
          max16, _mm_max_epu8(_mm256_castsi256_si128(max32), _mm256_extracti128_si256(max32, 1)));
      return _mm_movemask_epi8(_mm_cmpeq_epi8(m, _mm_set1_epi8(-1))) == 0;
    }
  };
  // For rows known to hold no NaN code (PackedWeight::rows_nan_free).
  struct NoGuard {
    static void note(__m128i) {}
    static void note(__m256i) {}
    static bool clean() { return true; }
  };
  static Block block(float scale) { return _mm512_set1_ps(scale * 0x1p120f); }  // |scale| < 2^8
  template <class G>
  static __m512 decode(const uint8_t* row, int64_t p, Block b, G& g) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + p));
    return finish(raw, b, g);
  }
  template <class G>
  static __m512 decode_tail(const uint8_t* row, int64_t p, Block b, G& g, __mmask16 mask) {
    return _mm512_maskz_mov_ps(mask, finish(_mm_maskz_loadu_epi8(mask, row + p), b, g));
  }
  template <class G>
  static __m512 finish(__m128i raw, Block b, G& g) {
    return _mm512_mul_ps(values(raw, g), b);
  }
  // The codes' values × 2^-120, without a multiplier.
  template <class G>
  static __m512 values(__m128i raw, G& g) {
    g.note(raw);
    return _mm512_castsi512_ps(
        _mm512_and_si512(_mm512_maskz_slli_epi32(0xffff, _mm512_maskz_cvtepi8_epi32(0xffff, raw), 20),
                         _mm512_set1_epi32(static_cast<int>(0x87F00000u))));
  }
  // Columns p..p+15 into lo and p+16..p+31 into hi, the same bits as two decode()s with fewer instructions
  // per weight: the 32 codes widened to 16 bits, sign-extended, shifted left by 4 and masked with 0x87F0 are
  // the high halves of decode()'s f32s (S.0000EEEE.MMM0000), which unpacking with zero words moves into
  // place. Unpacking works within 128-bit lanes (words 0-3 of each lane to lo, 4-7 to hi), so the codes'
  // dwords are first put in the order 0, 4, 1, 5, 2, 6, 3, 7 (4 codes each): lo gets columns 0..15 and hi
  // 16..31, in order.
  template <class G>
  static void decode32(const uint8_t* row, int64_t p, Block b, G& g, __m512& lo, __m512& hi) {
    values32(row, p, g, lo, hi);
    lo = _mm512_mul_ps(lo, b);
    hi = _mm512_mul_ps(hi, b);
  }
  // The same codes' values × 2^-120, without a multiplier.
  template <class G>
  static void values32(const uint8_t* row, int64_t p, G& g, __m512& lo, __m512& hi) {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + p));
    g.note(raw);
    const __m256i ordered = _mm256_permutevar8x32_epi32(raw, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    const __m512i words = _mm512_and_si512(
        _mm512_maskz_slli_epi16(~__mmask32(0), _mm512_maskz_cvtepi8_epi16(~__mmask32(0), ordered), 4),
        _mm512_set1_epi16(static_cast<short>(0x87F0)));
    lo = _mm512_castsi512_ps(_mm512_unpacklo_epi16(_mm512_setzero_si512(), words));
    hi = _mm512_castsi512_ps(_mm512_unpackhi_epi16(_mm512_setzero_si512(), words));
  }
};

// FP4 lanes are kept in a fixed permuted order: 8 bytes broadcast to every qword, each dword shifted right by
// its own count, leave nibble j (element p + j) in physical lane 2j and nibble 8 + j in lane 2j + 1 (vpermps
// reads only an index's low 4 bits). x is put in the same permutation once per call and the accumulators back
// in lane order before the reduction, so every lane's FMA chain is the one linear_lanes.hpp prescribes.
// A block's 16 products (E2M1 value × the block's multiplier, the reference's f32 product) come from a table
// of every scale code's 16 products, built once per call (256 vector products), so the loop has no multiply
// per block (NVFP4's blocks are a single vector).
struct Fp4Decoder {
  using Block = __m512;
  // Physical lane 2j holds logical lane j, lane 2j + 1 holds lane 8 + j.
  static __m512i logical_of_physical() {
    return _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
  }
  static __m512i physical_of_logical() {
    return _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  }
  alignas(64) float products[256][16];
  __m512i shifts = _mm512_setr_epi32(0, 0, 4, 4, 8, 8, 12, 12, 16, 16, 20, 20, 24, 24, 28, 28);
  explicit Fp4Decoder(const Scales& sc) {
    const __m512 lut = _mm512_loadu_ps(quant::kE2M1Values.data());
    for (int c = 0; c < 256; ++c)
      _mm512_store_ps(products[c], _mm512_mul_ps(lut, _mm512_set1_ps(sc.table[c])));
  }
  Block block_of_code(uint8_t code) const { return _mm512_load_ps(products[code]); }
  // The 16 elements whose 8 bytes start at `bytes`.
  __m512 decode(const uint8_t* bytes, Block b) const {
    int64_t q;
    std::memcpy(&q, bytes, 8);
    const __m512i nibbles = _mm512_maskz_srlv_epi32(0xffff, _mm512_set1_epi64(q), shifts);
    return _mm512_maskz_permutexvar_ps(0xffff, nibbles, b);
  }
};

// FP4 decode (m ≤ 4): NR weight rows at a time, 64 columns (4 vectors) per step and row, so the per-row
// pointers stay in registers and the loop's scalar work (scale codes, a prefetch per row) is spread over 4
// vectors. x is put in the decoder's lane permutation once per call. The weight two tiles ahead is
// prefetched into L2 at the same column (rows are contiguous, so that is the tile after next).
template <int MR, int NR, int BC>
void fp4_tile(const Fp4Decoder& dec, const uint8_t* data, int64_t row_bytes, const uint8_t* codes,
              int64_t code_stride, int64_t k, const float* xp, float* y, int64_t ldy,
              int64_t prefetch_ahead) {
  const uint8_t* d[NR];
  const uint8_t* c[NR];
  for (int j = 0; j < NR; ++j) {
    d[j] = data + j * row_bytes;
    c[j] = codes + j * code_stride;
  }
  __m512 acc[MR][NR];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
  // One scale block (BC columns: one or two vectors) of every row at column offset `off` from the row
  // pointers, which advance by whole steps (constant offsets inside a step keep the addressing simple).
  const float* xq = xp;
  const auto block = [&](int off) {
    __m512 mult[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) mult[j] = dec.block_of_code(c[j][off / BC]);
#pragma GCC unroll 2
    for (int q = off; q < off + BC; q += 16) {
      __m512 wv[NR];
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) wv[j] = dec.decode(d[j] + q / 2, mult[j]);
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i) {
        const __m512 xv = _mm512_loadu_ps(xq + i * k + q);
#pragma GCC unroll 8
        for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
      }
    }
  };
  const auto advance = [&](int cols) {
    for (int j = 0; j < NR; ++j) {
      d[j] += cols / 2;
      c[j] += cols / BC;
    }
    xq += cols;
  };
  for (int64_t steps = k / 64; steps > 0; --steps) {
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j)
      _mm_prefetch(reinterpret_cast<const char*>(d[j] + prefetch_ahead), _MM_HINT_T1);
#pragma GCC unroll 4
    for (int b = 0; b < 64; b += BC) block(b);
    advance(64);
  }
  for (int64_t left = k % 64; left > 0; left -= BC) {
    block(0);
    advance(BC);
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j)
      y[i * ldy + j] =
          reduce16(_mm512_maskz_permutexvar_ps(0xffff, Fp4Decoder::physical_of_logical(), acc[i][j]));
}

template <int MR, int BC>
void fp4_stream(const Fp4Decoder& dec, const LinearArgs& a) {
  constexpr int NR = 4;
  const PackedWeight& w = *a.w;
  const int64_t k = w.cols;
  // x rows in the decoder's lane order (one vpermps per 16 columns here instead of per step and tile).
  std::vector<float> xp(static_cast<size_t>(MR * k));
  for (int i = 0; i < MR; ++i)
    for (int64_t p = 0; p < k; p += 16)
      _mm512_storeu_ps(xp.data() + i * k + p,
                       _mm512_maskz_permutexvar_ps(0xffff, Fp4Decoder::logical_of_physical(),
                                                   _mm512_loadu_ps(a.x + i * a.ldx + p)));
  walk_fp4_rows<NR>(a, [&]<int R>(const uint8_t* data, const uint8_t* codes, float* y, int64_t ahead) {
    fp4_tile<MR, R, BC>(dec, data, w.row_bytes, codes, w.scale_row_stride, k, xp.data(), y, a.ldy, ahead);
  });
}

// FP8 decode (m ≤ 5), shaped as fp4_tile: NR rows, each scale block walked 64 columns (4 vectors) per step
// with one prefetch per row and step, then 16-column steps and a masked k tail. Returns false when a NaN code
// was met (the caller redoes the tile exactly).
//
// ScaledX: the NR rows lie in one block of rows whose multipliers are all powers of two (in [2^-100, 2^7]),
// as DeepSeek-V3.1's `scale_fmt: ue8m0` makes them. Then the reference's weight v · s is exact, and x · (v ·
// s) is the same real number as (x · s · 2^120) · (v · 2^-120), so the multiplier goes onto the x vector once
// per step (shared by the NR rows) instead of onto every row's weights, and each FMA rounds what the
// reference's rounds, provided x · s · 2^120 is exact: quant::fp8_decode_forms checks the call's x against
// its multipliers first. One thread decoding one x row from L2: 17.6 → 21.4 GB/s at 768 × 2048, 16.7 → 20.1
// at 2048 × 768 (with a per-vector class test of the scaled x instead of that check: 20.4 and 19.3).
//
// Guard: Fp8Decoder::Guard, or NoGuard for rows known to hold no NaN code.
template <int MR, int NR, bool ScaledX = false, class Guard = Fp8Decoder::Guard>
bool fp8_tile(const Scales& sc, const uint8_t* data, int64_t row_bytes, int64_t n, int64_t k, const float* x,
              int64_t ldx, float* y, int64_t ldy, int64_t prefetch_ahead) {
  const uint8_t* d[NR];
  int64_t base[NR];
  for (int j = 0; j < NR; ++j) {
    d[j] = data + (n + j) * row_bytes;
    base[j] = sc.row_base(n + j);
  }
  __m512 acc[MR][NR];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
  Guard guard;
  // x row i's vector at p (masked), times the multiplier where ScaledX.
  const auto x_vector = [&](int i, int64_t p, const __m512* mult, __mmask16 mask) {
    const __m512 xv = _mm512_maskz_loadu_ps(mask, x + i * ldx + p);
    return ScaledX ? _mm512_mul_ps(xv, mult[0]) : xv;
  };
  const auto step = [&](int64_t p, const __m512* mult) {
    __m512 wv[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j)
      wv[j] = ScaledX ? Fp8Decoder::values(_mm_loadu_si128(reinterpret_cast<const __m128i*>(d[j] + p)), guard)
                      : Fp8Decoder::decode(d[j], p, mult[j], guard);
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {
      const __m512 xv = x_vector(i, p, mult, 0xffff);
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  };
  const auto step32 = [&](int64_t p, const __m512* mult) {
    __m512 lo[NR], hi[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) {
      if constexpr (ScaledX)
        Fp8Decoder::values32(d[j], p, guard, lo[j], hi[j]);
      else
        Fp8Decoder::decode32(d[j], p, mult[j], guard, lo[j], hi[j]);
    }
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {
      const __m512 xl = x_vector(i, p, mult, 0xffff), xh = x_vector(i, p + 16, mult, 0xffff);
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j)
        acc[i][j] = _mm512_fmadd_ps(xh, hi[j], _mm512_fmadd_ps(xl, lo[j], acc[i][j]));
    }
  };
  const int64_t block_cols = sc.w->block_cols;
  int64_t block = 0;
  for (int64_t p0 = 0; p0 < k; p0 += block_cols, ++block) {
    __m512 mult[NR];
#pragma GCC unroll 8
    for (int j = 0; j < (ScaledX ? 1 : NR); ++j) mult[j] = Fp8Decoder::block(sc.get(base[j] + block));
    const int64_t pe = std::min(k, p0 + block_cols);
    int64_t p = p0;
    for (; p + 64 <= pe; p += 64) {
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j)
        _mm_prefetch(reinterpret_cast<const char*>(d[j] + p + prefetch_ahead), _MM_HINT_T1);
#pragma GCC unroll 2
      for (int v = 0; v < 64; v += 32) step32(p + v, mult);
    }
    for (; p + 16 <= pe; p += 16) step(p, mult);
    if (p < pe) {  // the k tail
      const __mmask16 mask = tail_mask(pe - p);
      __m512 wv[NR];
      for (int j = 0; j < NR; ++j)
        wv[j] = ScaledX ? _mm512_maskz_mov_ps(mask,
                                              Fp8Decoder::values(_mm_maskz_loadu_epi8(mask, d[j] + p), guard))
                        : Fp8Decoder::decode_tail(d[j], p, mult[j], guard, mask);
      for (int i = 0; i < MR; ++i) {
        const __m512 xv = x_vector(i, p, mult, mask);
        for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
      }
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) y[i * ldy + n + j] = reduce16(acc[i][j]);
  return guard.clean();
}

template <int MR>
void fp8_stream(const Fp8Rows& w, const LinearArgs& a, bool scaled_x_exact) {
  constexpr int NR = MR == 5 ? 3 : 4;  // 5 × 3 accumulators + 2 × 3 decoded + 3 multipliers + 2 x
  const int64_t k = a.w->cols;
  const int64_t ahead = 2 * NR * w.row_bytes;
  for (int64_t b = 0; b < std::min(ahead, (a.n1 - a.n0) * w.row_bytes); b += 64)
    _mm_prefetch(reinterpret_cast<const char*>(w.data + a.n0 * w.row_bytes + b), _MM_HINT_T1);
  // Rows [n, n + R): without the NaN check where their flags say so, else with it, recording rows found
  // clean; a tile that met a NaN code is redone exactly.
  const auto run = [&]<int R, bool ScaledX>(int64_t n, int64_t prefetch_ahead) {
    const bool clean = a.w->decode_rows_nan_checked(n, R, [&]<bool Checked>() {
      using Guard = std::conditional_t<Checked, Fp8Decoder::Guard, Fp8Decoder::NoGuard>;
      return fp8_tile<MR, R, ScaledX, Guard>(w.scales, w.data, w.row_bytes, n, k, a.x, a.ldx, a.y, a.ldy,
                                             prefetch_ahead);
    });
    if (!clean) tile<MR, R>(w, n, k, a.x, a.ldx, a.y, a.ldy);
  };
  int64_t n = a.n0;
  for (; n + NR <= a.n1; n += NR) {
    w.prefetch_scales(std::min(a.n1, n + 2 * NR), std::min(a.n1, n + 3 * NR));
    // One x row only: each further row adds a product and a class test per vector (3 rows: 4-5 % slower).
    if (MR == 1 && scaled_x_exact && w.scales.row_base(n) == w.scales.row_base(n + NR - 1))
      run.template operator()<NR, true>(n, ahead);
    else
      run.template operator()<NR, false>(n, ahead);
  }
  for (; n < a.n1; ++n) run.template operator()<1, false>(n, 0);
}

void fp8_decode(const Fp8Rows& w, const LinearArgs& a, bool scaled_x_exact) {
  switch (a.m) {
    case 1:
      return fp8_stream<1>(w, a, scaled_x_exact);
    case 2:
      return fp8_stream<2>(w, a, scaled_x_exact);
    case 3:
      return fp8_stream<3>(w, a, scaled_x_exact);
    case 4:
      return fp8_stream<4>(w, a, scaled_x_exact);
    default:
      return fp8_stream<5>(w, a, scaled_x_exact);
  }
}

template <int BC>
void fp4_decode(const Fp4Decoder& dec, const LinearArgs& a) {
  switch (a.m) {
    case 1:
      return fp4_stream<1, BC>(dec, a);
    case 2:
      return fp4_stream<2, BC>(dec, a);
    case 3:
      return fp4_stream<3, BC>(dec, a);
    default:
      return fp4_stream<4, BC>(dec, a);
  }
}

// Many rows (prefill, batches past the kSliceRows limits below): panels::linear_panels, the BF16 path's panel
// GEMM, over panels of weight rows dequantised here, once per panel and chunk of x rows, to the reference's
// f32 values. Each packer names its rows' codes (`span`), which the tiles over the panel before prefetch
// evenly (a row a panel further on, asked for while decoding, came in bursts that held the L1 fill buffers
// the decoding's own loads needed); the scales are a small share, left to the hardware.
constexpr int64_t kPanelRows = panels::kPanelRows;

// FP8: by the decode path's integer decoder where the scales allow it (Fp8Decoder); a panel in which that met
// a NaN code is decoded again by the exact conversion (Fp8Rows::load), which every panel takes otherwise.
struct Fp8PanelPacker {
  const Fp8Rows& w;
  int64_t k;
  bool integer_decode;
  WeightSpan span(int64_t j, int rows) const { return rows_span(w.data, w.row_bytes, w.row_bytes, j, rows); }
  void operator()(int64_t j, int rows, float* panel) const {
    if (integer_decode && pack_integer(j, rows, panel)) {
      w.scales.w->mark_rows_nan_free(j, rows);  // whole rows read: the decode tiles may trust them later
      return;
    }
    for (int r = 0; r < rows; ++r) {
      const int64_t n = j + r, base = w.scales.row_base(n);
      const int steps_per_block = w.scales.steps_per_block();
      for (int64_t s = 0, p = 0; p < k; ++s, p += 16)
        _mm512_store_ps(panel + (s * kPanelRows + r) * 16,
                        w.load(n, p, w.scales.get(base + s / steps_per_block), tail_mask(k - p)));
    }
  }
  // Fp8Decoder, 32 columns at a time where a block holds whole pairs of steps; false when it met a NaN code.
  bool pack_integer(int64_t j, int rows, float* panel) const {
    Fp8Decoder::Guard guard;
    const int steps_per_block = w.scales.steps_per_block();
    const int64_t pair_end = steps_per_block % 2 == 0 ? k / 32 * 32 : 0;
    for (int r = 0; r < rows; ++r) {
      const int64_t n = j + r, base = w.scales.row_base(n);
      const uint8_t* row = w.data + n * w.row_bytes;
      const auto block = [&](int64_t s) {
        return Fp8Decoder::block(w.scales.get(base + s / steps_per_block));
      };
      int64_t p = 0;
      for (; p < pair_end; p += 32) {
        __m512 lo, hi;
        Fp8Decoder::decode32(row, p, block(p / 16), guard, lo, hi);
        _mm512_store_ps(panel + (p / 16 * kPanelRows + r) * 16, lo);
        _mm512_store_ps(panel + ((p / 16 + 1) * kPanelRows + r) * 16, hi);
      }
      for (; p < k; p += 16) {
        const __mmask16 mask = tail_mask(k - p);
        _mm512_store_ps(panel + (p / 16 * kPanelRows + r) * 16,
                        mask == 0xffff ? Fp8Decoder::decode(row, p, block(p / 16), guard)
                                       : Fp8Decoder::decode_tail(row, p, block(p / 16), guard, mask));
      }
    }
    return guard.clean();
  }
};

// FP4 (k a multiple of the block, 16 or 32): Fp4Decoder's table lookups, then its lanes back in order.
template <int BC>
struct Fp4PanelPacker {
  const Fp4Decoder& dec;
  const PackedWeight& w;
  WeightSpan span(int64_t j, int rows) const { return rows_span(w.data, w.row_bytes, w.row_bytes, j, rows); }
  void operator()(int64_t j, int rows, float* panel) const {
    const auto* data = reinterpret_cast<const uint8_t*>(w.data);
    const auto* codes = reinterpret_cast<const uint8_t*>(w.scales);
    const __m512i order = Fp4Decoder::physical_of_logical();
    for (int r = 0; r < rows; ++r) {
      const int64_t n = j + r;
      const uint8_t* row = data + n * w.row_bytes;
      const uint8_t* code = codes + n * w.scale_row_stride;
      for (int64_t p = 0; p < w.cols; p += BC) {
        const Fp4Decoder::Block b = dec.block_of_code(code[p / BC]);
#pragma GCC unroll 2
        for (int q = 0; q < BC; q += 16)
          _mm512_store_ps(panel + ((p + q) / 16 * kPanelRows + r) * 16,
                          _mm512_maskz_permutexvar_ps(0xffff, order, dec.decode(row + (p + q) / 2, b)));
      }
    }
  }
};

// Up to kSliceRowsFp4 / kSliceRowsFp8 x rows (batched decode), the decode path above takes every call: the
// weight rows in slices of about kSliceBytes (a quarter of a Zen 4 core's L2), each slice run by every group
// of up to kGroupRows x rows in turn: the first group streams the slice from memory, the others read it from
// L2, and each decodes it again in registers. Groups are of nearly equal size (5 rows: 2 + 3, except in FP8's
// integer decode, whose groups take up to kFp8GroupRows); decode(part) runs a group's x rows over a slice's
// weight rows. From 4 rows this replaced the dequantised
// f32 panels: one thread, `xmoe linear-bench --threads 1 --clock thread --stream-mb 1 --prefill-rows M` at
// Qwen3-30B-A3B's shapes (GFLOP/s, panel → slices, Zen 4): MXFP4 60 → 94-103 at 4 rows, 78 → 94-103 at 8,
// 83-93 → 95-104 at 12-16; NVFP4 49-51 → 96-101, 69 → 101-104, 78-84 → 101-103; FP8, whose decode costs more
// per weight, 58 → 80-83 at 4, 65 → 76-79 at 7, 74-78 → 81-83 at 8, but 79-83 → 74-77 at 10 and 88-91 →
// 80-88 at 16. Groups of up to 3 rows (4 = 2 + 2) were 10-45 % slower at 4 rows and up to 12 % at 8.
constexpr int64_t kSliceRowsFp4 = 16, kSliceRowsFp8 = 8, kGroupRows = 4;
// FP8's integer decode also takes groups of 5 rows (tiles of 5 x rows × 3 weight rows: the registers hold no
// more), so 5 x rows decode each slice once instead of as 2 + 3: 64-68 → 72-77 GFLOP/s per thread at 5 rows.
// FP4's groups of 5 measured 3-12 % faster for MXFP4 at 5 rows but 15-20 % slower for NVFP4 at 9-15 (its
// per-block multipliers no longer fit beside 20 accumulators), so they stay at 4.
constexpr int64_t kFp8GroupRows = 5;
constexpr int64_t kSliceBytes = 256 << 10;

template <class Decode>
void slices_by_groups(const LinearArgs& a, int64_t bytes_per_row, const Decode& decode,
                      int64_t most_rows = kGroupRows) {
  const int64_t slice = a.m <= 3 ? a.n1 - a.n0 : std::max<int64_t>(8, kSliceBytes / bytes_per_row);
  const int64_t groups = (a.m + most_rows - 1) / most_rows;
  for (int64_t n0 = a.n0; n0 < a.n1; n0 += slice)
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t i0 = a.m * g / groups, i1 = a.m * (g + 1) / groups;
      decode(quant::args_part(a, i0, i1 - i0, n0, std::min(a.n1, n0 + slice) - n0));
    }
}

template <class Rows>
void linear(const LinearArgs& a, WeightFormat format) {
  quant::check_linear_args(a, format);
  if (a.m == 0 || a.n0 == a.n1) return;
  const Rows w(*a.w);
  if (a.m <= (std::is_same_v<Rows, Fp4Rows> ? kSliceRowsFp4 : kSliceRowsFp8)) {
    // The decode path for groups of 1 to 4 rows (part.m; up to 5 in FP8's integer decode), with what it
    // needs decided once per call.
    if constexpr (std::is_same_v<Rows, Fp4Rows>) {
      const Fp4Decoder dec(w.scales);
      const int64_t bytes_per_row = w.row_bytes + a.w->scale_row_stride;
      if (format == WeightFormat::mxfp4)
        return slices_by_groups(a, bytes_per_row, [&](const LinearArgs& part) { fp4_decode<32>(dec, part); });
      return slices_by_groups(a, bytes_per_row, [&](const LinearArgs& part) { fp4_decode<16>(dec, part); });
    } else {
      if (const quant::Fp8DecodeForms forms = quant::fp8_decode_forms(a); forms.integer_decode)
        return slices_by_groups(
            a, w.row_bytes, [&](const LinearArgs& part) { fp8_decode(w, part, forms.scaled_x); },
            kFp8GroupRows);
      return slices_by_groups(a, w.row_bytes, [&](const LinearArgs& part) {
        switch (part.m) {
          case 1:
            return stream_rows<1, 8>(w, part);
          case 2:
            return stream_rows<2, 8>(w, part);
          case 3:
            return stream_rows<3, 4>(w, part);
          default:
            return stream_rows<4, 4>(w, part);
        }
      });
    }
  }
  if constexpr (std::is_same_v<Rows, Fp4Rows>) {
    const Fp4Decoder dec(w.scales);
    if (format == WeightFormat::mxfp4)
      return panels::linear_panels(a.x, a.ldx, a.m, a.w->cols, a.n0, a.n1, a.y, a.ldy,
                                   Fp4PanelPacker<32>{dec, *a.w});
    return panels::linear_panels(a.x, a.ldx, a.m, a.w->cols, a.n0, a.n1, a.y, a.ldy,
                                 Fp4PanelPacker<16>{dec, *a.w});
  } else {
    panels::linear_panels(a.x, a.ldx, a.m, a.w->cols, a.n0, a.n1, a.y, a.ldy,
                          Fp8PanelPacker{w, a.w->cols, quant::fp8_decode_forms(a).integer_decode});
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

}  // namespace xmoe::kernels::avx512
