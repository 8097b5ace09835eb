// Vectorised exp, erfc and the activations built on them, 8 floats at a time: the AVX2+FMA twin of
// vector_math_avx512.hpp (same algorithms and constants; see there for the reasoning and accuracy). Include
// only from files compiled with the AVX2 flags (*_avx2.cpp); the functions are static inline so each such
// file gets its own copy.
#pragma once
#include <immintrin.h>

#include <cstdint>

namespace xmoe::kernels::avx2 {

// All-ones in the lanes before `remaining` elements, for maskload/maskstore tails.
static inline __m256i tail_mask(int64_t remaining) {
  const int r = remaining >= 8 ? 8 : static_cast<int>(remaining);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(r), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

static inline __m256 abs_ps(__m256 x) {
  return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x);
}

// Clamp to [lo, hi] that lets NaN through: MINPS/MAXPS return their second operand when either is NaN.
static inline __m256 clamp_keep_nan(__m256 x, float lo, float hi) {
  return _mm256_max_ps(_mm256_set1_ps(lo), _mm256_min_ps(_mm256_set1_ps(hi), x));
}

// Cephes expf (see vector_math_avx512.hpp). Without scalef, 2^n is applied as 2^(n/2)·2^(n − n/2): both
// factors are normal for the clamped range, the first product is exact and the second rounds subnormal
// results once.
static inline __m256 exp_ps(__m256 x) {
  x = clamp_keep_nan(x, -110.0f, 100.0f);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269502f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r);
  p = _mm256_add_ps(p, _mm256_set1_ps(1.0f));
  // A NaN x gives a meaningless n here, but p is NaN and so is the product.
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i n1 = _mm256_srai_epi32(ni, 1);
  const __m256i n2 = _mm256_sub_epi32(ni, n1);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

// e^(−x²) with x² split exactly into hi + lo (see vector_math_avx512.hpp).
static inline __m256 exp_neg_square_ps(__m256 x) {
  const __m256 hi = _mm256_mul_ps(x, x);
  const __m256 lo = _mm256_fmsub_ps(x, x, hi);
  const __m256 e = exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), hi));
  return _mm256_fnmadd_ps(e, lo, e);
}

// t·Q(t), t = 1/(1 + p·|x|): erfc(a) = t·Q(t)·e^(−a²) (coefficients and fit in vector_math_avx512.hpp).
static inline __m256 erfc_scaled_ps(__m256 abs_x, float p) {
  const __m256 t =
      _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_fmadd_ps(_mm256_set1_ps(p), abs_x, _mm256_set1_ps(1.0f)));
  __m256 q = _mm256_set1_ps(0.0106060477f);
  q = _mm256_fmadd_ps(q, t, _mm256_set1_ps(-0.00682173576f));
  q = _mm256_fmadd_ps(q, t, _mm256_set1_ps(-0.149758086f));
  q = _mm256_fmadd_ps(q, t, _mm256_set1_ps(0.371882975f));
  q = _mm256_fmadd_ps(q, t, _mm256_set1_ps(-0.310268164f));
  q = _mm256_fmadd_ps(q, t, _mm256_set1_ps(0.338082999f));
  q = _mm256_fmadd_ps(q, t, _mm256_set1_ps(0.0218270831f));
  q = _mm256_fmadd_ps(q, t, _mm256_set1_ps(0.184639543f));
  q = _mm256_fmadd_ps(q, t, _mm256_set1_ps(0.169651106f));
  q = _mm256_fmadd_ps(q, t, _mm256_set1_ps(0.185358495f));
  q = _mm256_fmadd_ps(q, t, _mm256_set1_ps(0.184799746f));
  return _mm256_mul_ps(t, q);
}

// erfc(a) for any a (NaN stays NaN); erfc(−a) = 2 − erfc(a).
static inline __m256 erfc_ps(__m256 a) {
  const __m256 abs_a = abs_ps(clamp_keep_nan(a, -10.7f, 10.7f));
  const __m256 c = _mm256_mul_ps(erfc_scaled_ps(abs_a, 0.3275911f), exp_neg_square_ps(abs_a));
  const __m256 neg = _mm256_cmp_ps(a, _mm256_setzero_ps(), _CMP_LT_OQ);
  return _mm256_blendv_ps(c, _mm256_sub_ps(_mm256_set1_ps(2.0f), c), neg);
}

// erf(a): a·R(a²) for |a| < 1, 1 − erfc(|a|) with a's sign beyond (see vector_math_avx512.hpp).
static inline __m256 erf_ps(__m256 a) {
  const __m256 s = _mm256_mul_ps(a, a);
  __m256 r = _mm256_set1_ps(-0.000564805989f);
  r = _mm256_fmadd_ps(r, s, _mm256_set1_ps(0.00492176181f));
  r = _mm256_fmadd_ps(r, s, _mm256_set1_ps(-0.0267150551f));
  r = _mm256_fmadd_ps(r, s, _mm256_set1_ps(0.112803169f));
  r = _mm256_fmadd_ps(r, s, _mm256_set1_ps(-0.376123428f));
  r = _mm256_fmadd_ps(r, s, _mm256_set1_ps(1.12837911f));
  const __m256 small = _mm256_mul_ps(a, r);
  const __m256 abs_a = abs_ps(a);
  const __m256 large = _mm256_sub_ps(_mm256_set1_ps(1.0f), erfc_ps(abs_a));
  const __m256 signed_large = _mm256_or_ps(large, _mm256_and_ps(a, _mm256_set1_ps(-0.0f)));
  const __m256 is_small = _mm256_cmp_ps(abs_a, _mm256_set1_ps(1.0f), _CMP_LT_OQ);
  return _mm256_blendv_ps(signed_large, small, is_small);
}

struct GeluParts {
  __m256 one_plus_erf;  // 1 + erf(x/√2) = erfc(−x/√2)
  __m256 gauss;         // e^(−x²/2)
};

// For x clamped to [−15, 15]; see vector_math_avx512.hpp.
static inline GeluParts gelu_parts(__m256 xc) {
  const __m256 hi = _mm256_mul_ps(xc, xc);
  const __m256 lo = _mm256_fmsub_ps(xc, xc, hi);
  const __m256 e = exp_ps(_mm256_mul_ps(_mm256_set1_ps(-0.5f), hi));
  const __m256 gauss = _mm256_fnmadd_ps(_mm256_mul_ps(e, _mm256_set1_ps(0.5f)), lo, e);
  const __m256 c = _mm256_mul_ps(erfc_scaled_ps(abs_ps(xc), 0.231641889f), gauss);  // erfc(|x|/√2)
  const __m256 pos = _mm256_cmp_ps(xc, _mm256_setzero_ps(), _CMP_GT_OQ);
  return {_mm256_blendv_ps(c, _mm256_sub_ps(_mm256_set1_ps(2.0f), c), pos), gauss};
}

// gelu(x) = ½·x·(1 + erf(x/√2)); gelu(−inf) = −0, gelu(+inf) = +inf.
static inline __m256 gelu_ps(__m256 x) {
  const GeluParts g = gelu_parts(clamp_keep_nan(x, -15.0f, 15.0f));
  const __m256 xl = _mm256_max_ps(_mm256_set1_ps(-15.0f), x);
  return _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), xl), g.one_plus_erf);
}

// gelu'(x) = ½·(1 + erf(x/√2)) + x·e^(−x²/2)/√(2π); exactly 0 / 1 beyond ±15.
static inline __m256 gelu_grad_ps(__m256 x) {
  const __m256 xc = clamp_keep_nan(x, -15.0f, 15.0f);
  const GeluParts g = gelu_parts(xc);
  return _mm256_fmadd_ps(_mm256_mul_ps(xc, _mm256_set1_ps(0.398942292f)), g.gauss,
                         _mm256_mul_ps(_mm256_set1_ps(0.5f), g.one_plus_erf));
}

// σ(x) and 1 − σ(x) without cancellation (see vector_math_avx512.hpp).
struct Sigmoid {
  __m256 s;
  __m256 one_minus_s;
};

static inline Sigmoid sigmoid_pair_ps(__m256 x) {
  const __m256 e = exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), abs_ps(x)));
  const __m256 d = _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_add_ps(_mm256_set1_ps(1.0f), e));
  const __m256 ed = _mm256_mul_ps(e, d);
  const __m256 nonneg = _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_GE_OQ);
  return {_mm256_blendv_ps(ed, d, nonneg), _mm256_blendv_ps(d, ed, nonneg)};
}

static inline __m256 sigmoid_ps(__m256 x) {
  return sigmoid_pair_ps(x).s;
}

// silu(x) = x·σ(x); silu(−inf) = −0.
static inline __m256 silu_ps(__m256 x) {
  const Sigmoid sg = sigmoid_pair_ps(x);
  return _mm256_mul_ps(_mm256_max_ps(_mm256_set1_ps(-200.0f), x), sg.s);
}

// silu'(x) = σ(x)·(1 + x·(1 − σ(x))), limits 0 and 1 at ±inf.
static inline __m256 silu_grad_ps(__m256 x) {
  const __m256 xc = clamp_keep_nan(x, -200.0f, 200.0f);
  const Sigmoid sg = sigmoid_pair_ps(xc);
  return _mm256_mul_ps(sg.s, _mm256_fmadd_ps(xc, sg.one_minus_s, _mm256_set1_ps(1.0f)));
}

}  // namespace xmoe::kernels::avx2
