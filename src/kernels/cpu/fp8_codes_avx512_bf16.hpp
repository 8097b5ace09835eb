// FP8 block weights on AVX-512 with BF16: the codes turned into bf16 weights in registers, the block
// multipliers, and the activations scaled by them and rounded (linear_quant_bf16dot.hpp's arithmetic). Shared
// by the VDPBF16PS kernels and the AMX ones; included only by files compiled for AVX512-BF16.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/bf16dot_lanes_avx512_bf16.hpp"
#include "kernels/cpu/linear_quant.hpp"
#include "kernels/packed_weight.hpp"

namespace xmoe::kernels::avx512_bf16 {

// FP8 chunk order: of each 64 elements, the even ones are step 0 and the odd ones step 1.
struct Fp8Order {
  __m512i even, odd;
  Fp8Order() {
    alignas(64) uint16_t e[32], o[32];
    for (int w = 0; w < 32; ++w) {
      e[w] = static_cast<uint16_t>(2 * w);
      o[w] = static_cast<uint16_t>(2 * w + 1);
    }
    even = _mm512_load_si512(e);
    odd = _mm512_load_si512(o);
  }
};

// One FP8 x row scaled: x'[p] = bf16(x[p] · mult[p]) by VCVTNE2PS2BF16 (nearest even, an f32 subnormal
// product as zero: linear_quant_bf16dot.hpp), zeros past k, in chunk order: chunk c's step 0 (its even
// elements) at dst + (c / 32) · step_stride words, step 1 (the odd ones) one step_stride on.
inline void pack_fp8_x_row(const Fp8Order& order, const float* x, int64_t k, const float* mult,
                           int64_t padded, uint16_t* dst, int64_t step_stride) {
  for (int64_t c = 0; c < padded; c += 64) {
    __m512 v[4];
    if (k - c >= 64) {
      for (int q = 0; q < 4; ++q)
        v[q] = _mm512_mul_ps(_mm512_loadu_ps(x + c + 16 * q), _mm512_loadu_ps(mult + c + 16 * q));
    } else {
      for (int q = 0; q < 4; ++q) {
        const int64_t rem = std::clamp<int64_t>(k - c - 16 * q, 0, 16);
        const __mmask16 mask = rem == 16 ? __mmask16(0xffff) : __mmask16((1u << rem) - 1);
        v[q] = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, x + c + 16 * q),
                             _mm512_maskz_loadu_ps(mask, mult + c + 16 * q));
      }
    }
    const __m512i lo = (__m512i)_mm512_cvtne2ps_pbh(v[1], v[0]),
                  hi = (__m512i)_mm512_cvtne2ps_pbh(v[3], v[2]);
    _mm512_store_si512(dst + c / 32 * step_stride, _mm512_permutex2var_epi16(lo, order.even, hi));
    _mm512_store_si512(dst + (c / 32 + 1) * step_stride, _mm512_permutex2var_epi16(lo, order.odd, hi));
  }
}

// FP8 block multipliers: mult[p] = q(n, p) · 2^8 for p < k, the f32 vector that scales the activations for
// the weight rows of n's block of rows (linear_quant_bf16dot.hpp).
struct Fp8Scales {
  const PackedWeight* w;
  float table[256];
  explicit Fp8Scales(const PackedWeight& pw) : w(&pw) {
    if (pw.scale_type != ScaleType::f32) quant::fill_scale_table(pw, table);
  }
  float get(int64_t index) const {
    if (w->scale_type == ScaleType::f32) {
      float s;
      std::memcpy(&s, w->scales + 4 * index, 4);
      return s;
    }
    return table[static_cast<uint8_t>(w->scales[index])];
  }
  void row(int64_t n, float* mult) const {
    const int64_t base = n / w->block_rows * w->scale_row_stride, bc = w->block_cols, k = w->cols;
    for (int64_t p0 = 0, b = 0; p0 < k; p0 += bc, ++b)
      std::fill(mult + p0, mult + std::min(k, p0 + bc), get(base + b) * 0x1p8f);
  }
};

// f(s0, s1) for the parts of [n0, n1) that lie in one block of rows (one multiplier vector each).
template <class F>
void for_each_row_block(const PackedWeight& w, int64_t n0, int64_t n1, const F& f) {
  for (int64_t s0 = n0; s0 < n1;) {
    const int64_t s1 = std::min(n1, (s0 / w.block_rows + 1) * w.block_rows);
    f(s0, s1);
    s0 = s1;
  }
}

// bf16 bits of E4M3 subnormals and zero × 2^-8 (m · 2^-17), by the mantissa m.
inline __m512i e4m3_subnormal_table() {
  return _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x3860,
                          0x3840, 0x3820, 0x3800, 0x37C0, 0x3780, 0x3700, 0x0000);
}

// Words whose high byte is an E4M3 code → that code's value × 2^-8 in bf16 (NaN codes excepted).
inline __m512bh e4m3_to_bf16(__m512i high, __m512i subnormals) {
  const __m512i t = _mm512_srai_epi16(high, 4);  // S.SSSS.EEEE.MMM.xxxx
  // (t & 0x07F0) | 0x3800: exponent 112 + E, mantissa MMM.
  __m512i mag = _mm512_ternarylogic_epi32(t, _mm512_set1_epi16(0x07F0), _mm512_set1_epi16(0x3800), 0xEA);
  const __mmask32 sub = _mm512_testn_epi16_mask(t, _mm512_set1_epi16(0x0780));
  mag = _mm512_mask_permutexvar_epi16(mag, sub, _mm512_srli_epi16(t, 4), subnormals);
  // mag | (t & 0x8000)
  return (__m512bh)_mm512_ternarylogic_epi32(mag, t, _mm512_set1_epi16(static_cast<short>(0x8000)), 0xF8);
}

// Words whose high byte is an E4M3 code of exponent ≥ 1 (not NaN) → that code's value × 2^-8 in bf16:
// (t & 0x87F0) | 0x3800, i.e. exponent 112 + E.
inline __m512bh e4m3_normal_to_bf16(__m512i high) {
  const __m512i t = _mm512_srai_epi16(high, 4);
  return (__m512bh)_mm512_ternarylogic_epi32(t, _mm512_set1_epi16(static_cast<short>(0x87F0)),
                                             _mm512_set1_epi16(0x3800), 0xEA);
}

// 64 FP8 codes from p (`left` of them before k; zeros after) and their two steps of 32 bf16 weights in the
// chunk order of linear_quant_bf16dot.hpp (read as 32 words, the low bytes are step 0 and the high bytes
// step 1, so a shift puts each code into its word's high byte). guard collects the codes' max with bit 7
// set (0xFF: a NaN code). Chunks whose codes all have exponent ≥ 1 (the common case) take the
// two-instruction decode; a chunk with a zero or subnormal code takes the one with the table fix-up.
// Guarded: false for rows known to hold no NaN code (PackedWeight::rows_nan_free), which skip the guard.
template <bool Guarded>
struct Fp8CodeDecoder {
  __m512i subnormals = e4m3_subnormal_table(), guard = _mm512_setzero_si512();
  // The codes; `fixup` tells whether a code of the first `left` has exponent 0.
  __m512i load(const uint8_t* p, int64_t left, bool& fixup) {
    const __m512i raw = left >= 64 ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi8(byte_mask(left), p);
    if constexpr (Guarded) guard = _mm512_max_epu8(guard, _mm512_or_si512(raw, _mm512_set1_epi8(-128)));
    fixup = _mm512_mask_testn_epi8_mask(byte_mask(left), raw, _mm512_set1_epi8(0x78)) != 0;
    return raw;
  }
  __m512bh step(__m512i raw, int s, bool fixup) const {
    const __m512i high = s == 0 ? _mm512_slli_epi16(raw, 8) : raw;
    return __builtin_expect(fixup, 0) ? e4m3_to_bf16(high, subnormals) : e4m3_normal_to_bf16(high);
  }
  bool clean() const { return !Guarded || _mm512_cmpeq_epi8_mask(guard, _mm512_set1_epi8(-1)) == 0; }
};
using Fp8Decoder = Fp8CodeDecoder<true>;

}  // namespace xmoe::kernels::avx512_bf16
