// AVX-512 element-wise kernels. Tails use masked loads and stores, so nothing past n is read or written.
// Reductions follow the canonical 64-lane order of elementwise_reference.cpp: dot products are bit-identical
// to the reference and to the AVX2 variant.

// GCC 12's AVX-512 intrinsics trip false -W(maybe-)uninitialized warnings on their internal
// _mm512_undefined_ps() (GCC bug 105593, fixed in GCC 13); it must be silenced before the intrinsics header
// is read.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <limits>

#include "kernels/cpu/variants.hpp"
#include "kernels/cpu/vector_math_avx512.hpp"
#include "xmoe/error.hpp"

namespace xmoe::kernels::avx512 {

namespace {

constexpr int64_t kW = 16;          // floats per register
constexpr int64_t kLanes = 4 * kW;  // canonical lane count of reductions

// acc[0..3] hold lanes 0..63; the pairing (j, j + 32), then (j, j + 16), ... is the reference's tree.
float reduce_lanes(const __m512 acc[4]) {
  const __m512 s32 = _mm512_add_ps(acc[0], acc[2]);
  const __m512 s32b = _mm512_add_ps(acc[1], acc[3]);
  const __m512 s16 = _mm512_add_ps(s32, s32b);
  const __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(s16),
                                  _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s16), 1)));
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  const __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
  return _mm_cvtss_f32(s1);
}

// Round to nearest even exactly as bf16::from_float, quieting NaN by setting bit 6 of the upper half.
__m256i cvt_f32_bf16(__m512 f) {
  const __m512i u = _mm512_castps_si512(f);
  const __m512i upper = _mm512_srli_epi32(u, 16);
  const __m512i lsb = _mm512_and_si512(upper, _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  r = _mm512_mask_or_epi32(r, nan, upper, _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(r);
}

__m512 cvt_bf16_f32(__m256i b) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
}

__m512 load_bf16(const bf16* p, __mmask16 m) {
  return cvt_bf16_f32(_mm256_maskz_loadu_epi16(m, reinterpret_cast<const void*>(p)));
}

void store_bf16(bf16* p, __mmask16 m, __m512 v) {
  const __m256i b = cvt_f32_bf16(v);
  _mm256_mask_storeu_epi16(reinterpret_cast<void*>(p), m, b);
}

// f(x) over n floats, 16 at a time; the last register is masked.
template <class F>
void map_f32(const float* in, float* out, int64_t n, F f) {
  for (int64_t i = 0; i < n; i += kW) {
    const __mmask16 m = tail_mask(n - i);
    _mm512_mask_storeu_ps(out + i, m, f(_mm512_maskz_loadu_ps(m, in + i)));
  }
}

template <class F>
void bias_act_rows(const float* in, const float* bias, float* out, int64_t rows, int64_t cols, F f) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = in + r * cols;
    float* y = out + r * cols;
    if (bias == nullptr) {
      map_f32(x, y, cols, f);  // no "+ 0", which would turn −0 into +0
      continue;
    }
    for (int64_t c = 0; c < cols; c += kW) {
      const __mmask16 m = tail_mask(cols - c);
      const __m512 v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, x + c), _mm512_maskz_loadu_ps(m, bias + c));
      _mm512_mask_storeu_ps(y + c, m, f(v));
    }
  }
}

template <class F>
void act_backward_map(const float* pre, const float* dout, float* din, int64_t n, F grad) {
  for (int64_t i = 0; i < n; i += kW) {
    const __mmask16 m = tail_mask(n - i);
    const __m512 p = _mm512_maskz_loadu_ps(m, pre + i);
    const __m512 d = _mm512_maskz_loadu_ps(m, dout + i);
    _mm512_mask_storeu_ps(din + i, m, _mm512_mul_ps(d, grad(p)));
  }
}

void check_size(int64_t n) {
  XMOE_CHECK(n >= 0, "element-wise kernel: negative length ", n);
}

}  // namespace

void softmax_rows_f32(const float* in, float* out, int64_t rows, int64_t cols) {
  XMOE_CHECK(rows >= 0 && cols >= 0, "softmax_rows_f32: negative shape [", rows, ", ", cols, "]");
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t r = 0; r < rows; ++r) {
    if (cols == 0) break;
    const float* x = in + r * cols;
    float* y = out + r * cols;
    // The max is exact in any order; a NaN anywhere makes the whole row NaN through the sum whatever it
    // picks.
    __m512 vmax = neg_inf;
    for (int64_t c = 0; c < cols; c += kW) {
      const __mmask16 m = tail_mask(cols - c);
      vmax = _mm512_max_ps(vmax, _mm512_mask_loadu_ps(neg_inf, m, x + c));
    }
    const __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(vmax));

    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int64_t base = 0; base < cols; base += kLanes) {
      for (int k = 0; k < 4; ++k) {
        const int64_t c = base + k * kW;
        if (c >= cols) break;
        const __mmask16 m = tail_mask(cols - c);
        const __m512 e = exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + c), mx));
        acc[k] = _mm512_mask_add_ps(acc[k], m, acc[k], e);
        _mm512_mask_storeu_ps(y + c, m, e);
      }
    }
    const __m512 sum = _mm512_set1_ps(reduce_lanes(acc));
    map_f32(y, y, cols, [&](__m512 e) { return _mm512_div_ps(e, sum); });
  }
}

void bias_act_f32(Activation act, const float* in, const float* bias, float* out, int64_t rows,
                  int64_t cols) {
  XMOE_CHECK(rows >= 0 && cols >= 0, "bias_act_f32: negative shape [", rows, ", ", cols, "]");
  switch (act) {
    case Activation::identity:
      bias_act_rows(in, bias, out, rows, cols, [](__m512 v) { return v; });
      return;
    case Activation::relu:
      // 0 > v ? 0 : v, the reference's form: NaN and −0 pass through unchanged.
      bias_act_rows(in, bias, out, rows, cols,
                    [](__m512 v) { return _mm512_max_ps(_mm512_setzero_ps(), v); });
      return;
    case Activation::gelu:
      bias_act_rows(in, bias, out, rows, cols, [](__m512 v) { return gelu_ps(v); });
      return;
    case Activation::silu:
      bias_act_rows(in, bias, out, rows, cols, [](__m512 v) { return silu_ps(v); });
      return;
  }
  XMOE_CHECK(false, "bias_act_f32: unknown activation ", static_cast<int>(act));
}

void act_backward_f32(Activation act, const float* pre, const float* dout, float* din, int64_t n) {
  check_size(n);
  switch (act) {
    case Activation::identity:
      map_f32(dout, din, n, [](__m512 v) { return v; });
      return;
    case Activation::relu:
      // A select, not dout·(pre > 0): inf or NaN gradients at pre ≤ 0 must give 0, not NaN.
      for (int64_t i = 0; i < n; i += kW) {
        const __mmask16 m = tail_mask(n - i);
        const __mmask16 pos =
            _mm512_mask_cmp_ps_mask(m, _mm512_maskz_loadu_ps(m, pre + i), _mm512_setzero_ps(), _CMP_GT_OQ);
        _mm512_mask_storeu_ps(din + i, m, _mm512_maskz_mov_ps(pos, _mm512_maskz_loadu_ps(m, dout + i)));
      }
      return;
    case Activation::gelu:
      act_backward_map(pre, dout, din, n, [](__m512 p) { return gelu_grad_ps(p); });
      return;
    case Activation::silu:
      act_backward_map(pre, dout, din, n, [](__m512 p) { return silu_grad_ps(p); });
      return;
  }
  XMOE_CHECK(false, "act_backward_f32: unknown activation ", static_cast<int>(act));
}

void silu_mul_f32(const float* g, const float* u, float* out, int64_t n) {
  check_size(n);
  for (int64_t i = 0; i < n; i += kW) {
    const __mmask16 m = tail_mask(n - i);
    const __m512 s = silu_ps(_mm512_maskz_loadu_ps(m, g + i));
    _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(s, _mm512_maskz_loadu_ps(m, u + i)));
  }
}

void silu_mul_backward_f32(const float* g, const float* u, const float* dout, float* dg, float* du,
                           int64_t n) {
  check_size(n);
  for (int64_t i = 0; i < n; i += kW) {
    const __mmask16 m = tail_mask(n - i);
    const __m512 gv = _mm512_maskz_loadu_ps(m, g + i);
    const __m512 uv = _mm512_maskz_loadu_ps(m, u + i);
    const __m512 d = _mm512_maskz_loadu_ps(m, dout + i);
    // All loads precede the stores, so dg or du may be the same array as an input.
    const __m512 dgv = _mm512_mul_ps(_mm512_mul_ps(d, uv), silu_grad_ps(gv));
    const __m512 duv = _mm512_mul_ps(d, silu_ps(gv));
    _mm512_mask_storeu_ps(dg + i, m, dgv);
    _mm512_mask_storeu_ps(du + i, m, duv);
  }
}

void f32_to_bf16(const float* in, bf16* out, int64_t n) {
  check_size(n);
  for (int64_t i = 0; i < n; i += kW) {
    const __mmask16 m = tail_mask(n - i);
    store_bf16(out + i, m, _mm512_maskz_loadu_ps(m, in + i));
  }
}

void bf16_to_f32(const bf16* in, float* out, int64_t n) {
  check_size(n);
  for (int64_t i = 0; i < n; i += kW) {
    const __mmask16 m = tail_mask(n - i);
    _mm512_mask_storeu_ps(out + i, m, load_bf16(in + i, m));
  }
}

void scale_f32(float a, const float* x, float* y, int64_t n) {
  check_size(n);
  const __m512 va = _mm512_set1_ps(a);
  map_f32(x, y, n, [&](__m512 v) { return _mm512_mul_ps(va, v); });
}

void axpy_f32(float a, const float* x, float* y, int64_t n) {
  check_size(n);
  const __m512 va = _mm512_set1_ps(a);
  for (int64_t i = 0; i < n; i += kW) {
    const __mmask16 m = tail_mask(n - i);
    const __m512 r = _mm512_fmadd_ps(va, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i));
    _mm512_mask_storeu_ps(y + i, m, r);
  }
}

float dot_f32(const float* a, const float* b, int64_t n) {
  check_size(n);
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int k = 0; k < 4; ++k) {
      acc[k] = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + k * kW), _mm512_loadu_ps(b + i + k * kW), acc[k]);
    }
  }
  for (int k = 0; i + k * kW < n; ++k) {
    const int64_t c = i + k * kW;
    const __mmask16 m = tail_mask(n - c);
    // Masked-off lanes keep their sums untouched, as the reference skips them.
    acc[k] =
        _mm512_mask3_fmadd_ps(_mm512_maskz_loadu_ps(m, a + c), _mm512_maskz_loadu_ps(m, b + c), acc[k], m);
  }
  return reduce_lanes(acc);
}

void scale_bf16(float a, const bf16* x, bf16* y, int64_t n) {
  check_size(n);
  const __m512 va = _mm512_set1_ps(a);
  for (int64_t i = 0; i < n; i += kW) {
    const __mmask16 m = tail_mask(n - i);
    store_bf16(y + i, m, _mm512_mul_ps(va, load_bf16(x + i, m)));
  }
}

void axpy_bf16_f32(float a, const bf16* x, float* y, int64_t n) {
  check_size(n);
  const __m512 va = _mm512_set1_ps(a);
  for (int64_t i = 0; i < n; i += kW) {
    const __mmask16 m = tail_mask(n - i);
    const __m512 r = _mm512_fmadd_ps(va, load_bf16(x + i, m), _mm512_maskz_loadu_ps(m, y + i));
    _mm512_mask_storeu_ps(y + i, m, r);
  }
}

float dot_bf16_f32(const bf16* a, const float* b, int64_t n) {
  check_size(n);
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int k = 0; k < 4; ++k) {
      const __m512 av = load_bf16(a + i + k * kW, static_cast<__mmask16>(0xffff));
      acc[k] = _mm512_fmadd_ps(av, _mm512_loadu_ps(b + i + k * kW), acc[k]);
    }
  }
  for (int k = 0; i + k * kW < n; ++k) {
    const int64_t c = i + k * kW;
    const __mmask16 m = tail_mask(n - c);
    acc[k] = _mm512_mask3_fmadd_ps(load_bf16(a + c, m), _mm512_maskz_loadu_ps(m, b + c), acc[k], m);
  }
  return reduce_lanes(acc);
}

}  // namespace xmoe::kernels::avx512
