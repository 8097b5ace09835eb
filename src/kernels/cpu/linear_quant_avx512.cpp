// AVX-512 linears over block-quantized weights, bit-identical to linear_quant_reference.cpp (the order is
// described in linear_quant.hpp): weights are decoded 16 at a time in registers, their block multiplier
// folded in with one f32 product, and each output is a 16-lane FMA chain over k reduced by the fixed tree.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/linear_quant.hpp"
#include "kernels/quant/block_scale.hpp"
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
// built once per call with the very expression the reference uses (quant::block_multiplier), so the products
// are the same bits.
struct Scales {
  const PackedWeight* w;
  float table[256];
  explicit Scales(const PackedWeight& pw) : w(&pw) {
    if (pw.scale_type == ScaleType::f32) return;
    for (int c = 0; c < 256; ++c) {
      const float s = quant::decode_scale(pw.scale_type, reinterpret_cast<const std::byte*>(&c), 0);
      table[c] = pw.format == WeightFormat::nvfp4 ? s * pw.global_scale : s;
    }
  }
  float at(int64_t n, int64_t p) const {
    const int64_t index = (n / w->block_rows) * w->scale_row_stride + p / w->block_cols;
    if (w->scale_type == ScaleType::f32) {
      float s;
      std::memcpy(&s, w->scales + 4 * index, 4);
      return s;
    }
    return table[static_cast<uint8_t>(w->scales[index])];
  }
};

// E4M3 codes (one per 32-bit lane) → f32 by integer operations only (independent of denormals-are-zero):
// normals rebias the exponent, subnormals are m · 2^-9 (exact through int → float), 0x7F is NaN.
inline __m512 e4m3_to_ps(__m512i v) {
  const __m512i mag = _mm512_and_si512(v, _mm512_set1_epi32(0x7F));
  const __m512i sign = _mm512_maskz_slli_epi32(0xffff, _mm512_and_si512(v, _mm512_set1_epi32(0x80)), 24);
  const __m512i normal =
      _mm512_add_epi32(_mm512_maskz_slli_epi32(0xffff, mag, 20), _mm512_set1_epi32(120 << 23));
  const __m512 sub = _mm512_mul_ps(_mm512_maskz_cvtepi32_ps(0xffff, mag), _mm512_set1_ps(1.0f / 512));
  __m512 f = _mm512_mask_blend_ps(_mm512_cmplt_epi32_mask(mag, _mm512_set1_epi32(8)),
                                  _mm512_castsi512_ps(normal), sub);
  f = _mm512_mask_mov_ps(f, _mm512_cmpeq_epi32_mask(mag, _mm512_set1_epi32(0x7F)),
                         _mm512_castsi512_ps(_mm512_set1_epi32(0x7FC00000)));
  return _mm512_or_ps(f, _mm512_castsi512_ps(sign));
}

struct Fp8Rows {
  const uint8_t* data;
  int64_t row_bytes;
  Scales scales;
  explicit Fp8Rows(const PackedWeight& w)
      : data(reinterpret_cast<const uint8_t*>(w.data)), row_bytes(w.row_bytes), scales(w) {}
  __m512 load(int64_t n, int64_t p, __mmask16 mask) const {
    const __m128i bytes = _mm_maskz_loadu_epi8(mask, data + n * row_bytes + p);
    const __m512 v = e4m3_to_ps(_mm512_maskz_cvtepu8_epi32(0xffff, bytes));
    return _mm512_maskz_mul_ps(mask, v, _mm512_set1_ps(scales.at(n, p)));
  }
};

// 16 E2M1 codes from 8 bytes, element 2j in the low nibble of byte j, decoded through a 16-entry table.
struct Fp4Rows {
  const uint8_t* data;
  int64_t row_bytes;
  Scales scales;
  __m512 lut;
  explicit Fp4Rows(const PackedWeight& w)
      : data(reinterpret_cast<const uint8_t*>(w.data)),
        row_bytes(w.row_bytes),
        scales(w),
        lut(_mm512_loadu_ps(quant::kE2M1Values.data())) {}
  __m512 load(int64_t n, int64_t p, __mmask16) const {  // k is a multiple of 16: no tail
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(data + n * row_bytes + p / 2));
    const __m128i lo = _mm_and_si128(b, _mm_set1_epi8(0x0F));
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0x0F));
    const __m512i idx = _mm512_maskz_cvtepu8_epi32(0xffff, _mm_unpacklo_epi8(lo, hi));
    return _mm512_mul_ps(_mm512_maskz_permutexvar_ps(0xffff, idx, lut), _mm512_set1_ps(scales.at(n, p)));
  }
};

// Dequantised rows in an f32 panel (the prefill path).
struct F32Rows {
  const float* data;
  int64_t ld, first_row;
  __m512 load(int64_t n, int64_t p, __mmask16 mask) const {
    return _mm512_maskz_loadu_ps(mask, data + (n - first_row) * ld + p);
  }
};

// MR x rows × NR weight rows starting at n; each step decodes NR weight vectors once for all MR rows.
template <int MR, int NR, class Rows>
void tile(const Rows& w, int64_t n, int64_t k, const float* x, int64_t ldx, float* y, int64_t ldy) {
  __m512 acc[MR][NR];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t p = 0; p < k; p += 16) {
    const __mmask16 mask = tail_mask(k - p);
    __m512 wv[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) wv[j] = w.load(n + j, p, mask);
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
  int64_t n = a.n0;
  for (; n + NR <= a.n1; n += NR) tile<MR, NR>(w, n, k, a.x, a.ldx, a.y, a.ldy);
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
    for (int64_t n = n0; n < n1; ++n)
      for (int64_t p = 0; p < k; p += 16)
        _mm512_storeu_ps(panel.data() + (n - n0) * ld + p, w.load(n, p, tail_mask(k - p)));
    const F32Rows f{panel.data(), ld, n0};
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
