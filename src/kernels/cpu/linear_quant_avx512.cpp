// AVX-512 linears over block-quantized weights, bit-identical to linear_quant_reference.cpp (the order is
// described in linear_quant.hpp): weights are decoded 16 at a time in registers, their block multiplier
// folded in with one f32 product, and each output is a 16-lane FMA chain over k reduced by the fixed tree.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/linear_quant.hpp"
#include "kernels/quant/codecs.hpp"

namespace xmoe::kernels::avx512 {
namespace {

inline float reduce16(__m512 v) {
  const __m256 s8 =
      _mm256_add_ps(_mm512_maskz_extractf32x8_ps(0xff, v, 0), _mm512_maskz_extractf32x8_ps(0xff, v, 1));
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  const __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
  return _mm_cvtss_f32(s1);
}

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

// Dequantised rows in an f32 panel (the prefill path): no scales.
struct F32Rows {
  const float* data;
  int64_t ld, first_row;
  struct NoScales {
    int64_t row_base(int64_t) const { return 0; }
    int steps_per_block() const { return 1 << 30; }
    float get(int64_t) const { return 1.0f; }
  } scales;
  __m512 load(int64_t n, int64_t p, float, __mmask16 mask) const {
    return _mm512_maskz_loadu_ps(mask, data + (n - first_row) * ld + p);
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

// Decode: MR (< 4) rows, the weight streams once, NR rows at a time.
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

template <int NR>
void panel_row_tail(const F32Rows& w, int64_t n, int64_t k, const LinearArgs& a, int64_t i) {
  const float* x = a.x + i * a.ldx;
  float* y = a.y + i * a.ldy;
  switch (a.m - i) {
    case 3:
      return tile<3, NR>(w, n, k, x, a.ldx, y, a.ldy);
    case 2:
      return tile<2, NR>(w, n, k, x, a.ldx, y, a.ldy);
    case 1:
      return tile<1, NR>(w, n, k, x, a.ldx, y, a.ldy);
    default:
      return;
  }
}

// Many rows: a panel of kPanel weight rows is dequantised once into f32 (in L2), then every block of four x
// rows passes over it in 4 × 4 register tiles, so each x block is reused kPanel / 4 times from L1.
template <class Rows>
void panel_gemm(const Rows& w, const LinearArgs& a) {
  constexpr int64_t kPanel = 16;
  const int64_t k = a.w->cols, ld = (k + 15) / 16 * 16;
  std::vector<float> panel(static_cast<size_t>(kPanel * ld));
  for (int64_t n0 = a.n0; n0 < a.n1; n0 += kPanel) {
    const int64_t n1 = std::min(a.n1, n0 + kPanel);
    for (int64_t n = n0; n < n1; ++n) {
      const int64_t base = w.scales.row_base(n);
      const int steps_per_block = w.scales.steps_per_block();
      for (int64_t p = 0; p < k; p += 16) {
        const float scale = w.scales.get(base + p / 16 / steps_per_block);
        _mm512_storeu_ps(panel.data() + (n - n0) * ld + p, w.load(n, p, scale, tail_mask(k - p)));
      }
    }
    const F32Rows f{panel.data(), ld, n0, {}};
    int64_t i = 0;
    for (; i + 4 <= a.m; i += 4) {
      int64_t n = n0;
      for (; n + 4 <= n1; n += 4) tile<4, 4>(f, n, k, a.x + i * a.ldx, a.ldx, a.y + i * a.ldy, a.ldy);
      for (; n < n1; ++n) tile<4, 1>(f, n, k, a.x + i * a.ldx, a.ldx, a.y + i * a.ldy, a.ldy);
    }
    if (i < a.m) {
      int64_t n = n0;
      for (; n + 4 <= n1; n += 4) panel_row_tail<4>(f, n, k, a, i);
      for (; n < n1; ++n) panel_row_tail<1>(f, n, k, a, i);
    }
  }
}

template <class Rows>
void linear(const LinearArgs& a, WeightFormat format) {
  quant::check_linear_args(a, format);
  if (a.m == 0 || a.n0 == a.n1) return;
  const Rows w(*a.w);
  switch (a.m) {
    case 1:
      return stream_rows<1, 8>(w, a);
    case 2:
      return stream_rows<2, 8>(w, a);
    case 3:
      return stream_rows<3, 4>(w, a);
    default:
      return panel_gemm(w, a);
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
