// Vectorised exp, erfc and the activations built on them, 16 floats at a time. Include only from files
// compiled with the AVX-512 flags (*_avx512.cpp); the functions are static inline so each such file gets its
// own copy.
//
// Accuracy against libm in double, rounded (measured by tests/test_elementwise.cpp): exp ≤ 1.2e-7 relative
// (1 ulp), sigmoid ≤ 2.3e-7, erf ≤ 1.5e-7, erfc ≤ 4.5e-7 (the rounding of t = 1/(1 + p·a) is amplified about
// 3× near a = 0), gelu ≤ 5e-7; derivatives within ~4e-7 absolute where they cross zero. Subnormal results
// carry only absolute accuracy.
#pragma once
#include <immintrin.h>

#include <cstdint>

namespace xmoe::kernels::avx512 {

// Lanes of each register that lie before `remaining` elements (the rest are masked off for tails).
static inline __mmask16 tail_mask(int64_t remaining) {
  return remaining >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << remaining) - 1u);
}

// Clamp to [lo, hi] that lets NaN through: MINPS/MAXPS return their second operand when either is NaN.
static inline __m512 clamp_keep_nan(__m512 x, float lo, float hi) {
  return _mm512_max_ps(_mm512_set1_ps(lo), _mm512_min_ps(_mm512_set1_ps(hi), x));
}

// Cephes expf: x = n·ln2 + r with |r| ≤ ln2/2 (ln2 split in two so that n·ln2_hi is exact), a degree-6
// polynomial for e^r, then scalef for 2^n, which rounds subnormal results once and overflows to inf.
static inline __m512 exp_ps(__m512 x) {
  // Beyond these bounds the float result is already 0 or inf; the clamp keeps n·ln2 finite, since ±inf would
  // turn the range reduction into inf − inf.
  x = clamp_keep_nan(x, -110.0f, 100.0f);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269502f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r);
  p = _mm512_add_ps(p, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// e^(−x²) without the error of rounding x² first: x² = hi + lo exactly (FMA), e^(−hi) by exp_ps and
// e^(−lo) ≈ 1 − lo because |lo| ≤ ulp(hi)/2. Rounding x² would cost up to x²·2⁻²⁴ relative error (6e-6 at
// x=10).
static inline __m512 exp_neg_square_ps(__m512 x) {
  const __m512 hi = _mm512_mul_ps(x, x);
  const __m512 lo = _mm512_fmsub_ps(x, x, hi);
  const __m512 e = exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), hi));
  return _mm512_fnmadd_ps(e, lo, e);
}

// t·Q(t) with t = 1/(1 + p·a), p = 0.3275911 (Abramowitz & Stegun 7.1.26's variable), so that
// erfc(a) = t·Q(t)·e^(−a²) for a ≥ 0. Q is a degree-10 Chebyshev fit of erfc(a)·e^(a²)/t over a ∈ [0, 10.7]
// (beyond that erfc underflows in float), relative error 2.8e-8 with these float coefficients. p is a
// parameter so that gelu can pass |x| itself with a = |x|/√2 folded into p/√2 = 0.231641889.
static inline __m512 erfc_scaled_ps(__m512 abs_x, float p) {
  const __m512 t =
      _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_fmadd_ps(_mm512_set1_ps(p), abs_x, _mm512_set1_ps(1.0f)));
  __m512 q = _mm512_set1_ps(0.0106060477f);
  q = _mm512_fmadd_ps(q, t, _mm512_set1_ps(-0.00682173576f));
  q = _mm512_fmadd_ps(q, t, _mm512_set1_ps(-0.149758086f));
  q = _mm512_fmadd_ps(q, t, _mm512_set1_ps(0.371882975f));
  q = _mm512_fmadd_ps(q, t, _mm512_set1_ps(-0.310268164f));
  q = _mm512_fmadd_ps(q, t, _mm512_set1_ps(0.338082999f));
  q = _mm512_fmadd_ps(q, t, _mm512_set1_ps(0.0218270831f));
  q = _mm512_fmadd_ps(q, t, _mm512_set1_ps(0.184639543f));
  q = _mm512_fmadd_ps(q, t, _mm512_set1_ps(0.169651106f));
  q = _mm512_fmadd_ps(q, t, _mm512_set1_ps(0.185358495f));
  q = _mm512_fmadd_ps(q, t, _mm512_set1_ps(0.184799746f));
  return _mm512_mul_ps(t, q);
}

// erfc(a) for any a (NaN stays NaN); erfc(−a) = 2 − erfc(a).
static inline __m512 erfc_ps(__m512 a) {
  const __m512 abs_a = _mm512_abs_ps(clamp_keep_nan(a, -10.7f, 10.7f));
  const __m512 c = _mm512_mul_ps(erfc_scaled_ps(abs_a, 0.3275911f), exp_neg_square_ps(abs_a));
  const __mmask16 neg = _mm512_cmp_ps_mask(a, _mm512_setzero_ps(), _CMP_LT_OQ);
  return _mm512_mask_sub_ps(c, neg, _mm512_set1_ps(2.0f), c);
}

// erf(a): a·R(a²) for |a| < 1 (R a degree-5 Chebyshev fit of erf(a)/a, relative error 5.5e-8), where
// 1 − erfc(a) would lose the relative accuracy of small results; 1 − erfc(|a|) with a's sign beyond.
static inline __m512 erf_ps(__m512 a) {
  const __m512 s = _mm512_mul_ps(a, a);
  __m512 r = _mm512_set1_ps(-0.000564805989f);
  r = _mm512_fmadd_ps(r, s, _mm512_set1_ps(0.00492176181f));
  r = _mm512_fmadd_ps(r, s, _mm512_set1_ps(-0.0267150551f));
  r = _mm512_fmadd_ps(r, s, _mm512_set1_ps(0.112803169f));
  r = _mm512_fmadd_ps(r, s, _mm512_set1_ps(-0.376123428f));
  r = _mm512_fmadd_ps(r, s, _mm512_set1_ps(1.12837911f));
  const __m512 small = _mm512_mul_ps(a, r);
  const __m512 abs_a = _mm512_abs_ps(a);
  const __m512 large = _mm512_sub_ps(_mm512_set1_ps(1.0f), erfc_ps(abs_a));
  const __m512 signed_large = _mm512_or_ps(large, _mm512_and_ps(a, _mm512_set1_ps(-0.0f)));
  const __mmask16 is_small = _mm512_cmp_ps_mask(abs_a, _mm512_set1_ps(1.0f), _CMP_LT_OQ);
  return _mm512_mask_blend_ps(is_small, signed_large, small);
}

// The pieces gelu and its derivative share, for x clamped to [−15, 15] (|x| > 15: e^(−x²/2) underflows and
// 1 + erf(x/√2) is exactly 0 or 2). 1 + erf(x/√2) comes from erfc directly, never as 1 + (−1 + ε), so it
// keeps its relative accuracy in the left tail.
struct GeluParts {
  __m512 one_plus_erf;  // 1 + erf(x/√2) = erfc(−x/√2)
  __m512 gauss;         // e^(−x²/2)
};

static inline GeluParts gelu_parts(__m512 xc) {
  // x²/2 is split from x itself so that no rounded x/√2 enters the exponent.
  const __m512 hi = _mm512_mul_ps(xc, xc);
  const __m512 lo = _mm512_fmsub_ps(xc, xc, hi);
  const __m512 e = exp_ps(_mm512_mul_ps(_mm512_set1_ps(-0.5f), hi));
  const __m512 gauss = _mm512_fnmadd_ps(_mm512_mul_ps(e, _mm512_set1_ps(0.5f)), lo, e);
  const __m512 c = _mm512_mul_ps(erfc_scaled_ps(_mm512_abs_ps(xc), 0.231641889f), gauss);  // erfc(|x|/√2)
  const __mmask16 pos = _mm512_cmp_ps_mask(xc, _mm512_setzero_ps(), _CMP_GT_OQ);
  return {_mm512_mask_sub_ps(c, pos, _mm512_set1_ps(2.0f), c), gauss};
}

// gelu(x) = ½·x·(1 + erf(x/√2)); gelu(−inf) = −0 (the limit), gelu(+inf) = +inf.
static inline __m512 gelu_ps(__m512 x) {
  const GeluParts g = gelu_parts(clamp_keep_nan(x, -15.0f, 15.0f));
  // For x ≥ 15 one_plus_erf is exactly 2, so the unclamped x passes through; below −15 it is exactly 0 and
  // the clamp avoids −inf·0.
  const __m512 xl = _mm512_max_ps(_mm512_set1_ps(-15.0f), x);
  return _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.5f), xl), g.one_plus_erf);
}

// gelu'(x) = ½·(1 + erf(x/√2)) + x·e^(−x²/2)/√(2π); exactly 0 / 1 beyond ±15.
static inline __m512 gelu_grad_ps(__m512 x) {
  const __m512 xc = clamp_keep_nan(x, -15.0f, 15.0f);
  const GeluParts g = gelu_parts(xc);
  return _mm512_fmadd_ps(_mm512_mul_ps(xc, _mm512_set1_ps(0.398942292f)), g.gauss,
                         _mm512_mul_ps(_mm512_set1_ps(0.5f), g.one_plus_erf));
}

// σ(x) and 1 − σ(x), each computed without cancellation: with e = e^(−|x|) ≤ 1 and d = 1/(1 + e), one is d
// and the other e·d. No overflow for any x; NaN gives NaN.
struct Sigmoid {
  __m512 s;
  __m512 one_minus_s;
};

static inline Sigmoid sigmoid_pair_ps(__m512 x) {
  const __m512 e = exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(x)));
  const __m512 d = _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_add_ps(_mm512_set1_ps(1.0f), e));
  const __m512 ed = _mm512_mul_ps(e, d);
  const __mmask16 nonneg = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_GE_OQ);
  return {_mm512_mask_blend_ps(nonneg, ed, d), _mm512_mask_blend_ps(nonneg, d, ed)};
}

static inline __m512 sigmoid_ps(__m512 x) {
  return sigmoid_pair_ps(x).s;
}

// silu(x) = x·σ(x); silu(−inf) = −0 (the limit). Below −200 σ(x) is exactly 0 in float.
static inline __m512 silu_ps(__m512 x) {
  const Sigmoid sg = sigmoid_pair_ps(x);
  return _mm512_mul_ps(_mm512_max_ps(_mm512_set1_ps(-200.0f), x), sg.s);
}

// silu'(x) = σ(x)·(1 + x·(1 − σ(x))); the clamp gives the limits 0 and 1 at ±inf instead of inf·0.
static inline __m512 silu_grad_ps(__m512 x) {
  const __m512 xc = clamp_keep_nan(x, -200.0f, 200.0f);
  const Sigmoid sg = sigmoid_pair_ps(xc);
  return _mm512_mul_ps(sg.s, _mm512_fmadd_ps(xc, sg.one_minus_s, _mm512_set1_ps(1.0f)));
}

}  // namespace xmoe::kernels::avx512
