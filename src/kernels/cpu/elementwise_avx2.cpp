// AVX2+FMA element-wise kernels. Float tails use maskload/maskstore and bf16 tails go through a small zeroed
// buffer, so nothing past n is read or written. Reductions follow the canonical 64-lane order of
// elementwise_reference.cpp (eight registers of eight lanes): dot products are bit-identical to the reference
// and to the AVX-512 variant.
#include <immintrin.h>

#include <cstring>
#include <limits>

#include "kernels/cpu/variants.hpp"
#include "kernels/cpu/vector_math_avx2.hpp"
#include "xmoe/error.hpp"

namespace xmoe::kernels::avx2 {

namespace {

constexpr int64_t kW = 8;     // floats per register
constexpr int64_t kRegs = 8;  // registers per canonical 64-lane block
constexpr int64_t kLanes = kRegs * kW;

// acc[0..7] hold lanes 0..63; the pairing (j, j + 32), then (j, j + 16), ... is the reference's tree.
float reduce_lanes(const __m256 acc[kRegs]) {
  __m256 s32[4], s16[2];
  for (int k = 0; k < 4; ++k) s32[k] = _mm256_add_ps(acc[k], acc[k + 4]);
  for (int k = 0; k < 2; ++k) s16[k] = _mm256_add_ps(s32[k], s32[k + 2]);
  const __m256 s8 = _mm256_add_ps(s16[0], s16[1]);
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  const __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
  return _mm_cvtss_f32(s1);
}

// Round to nearest even exactly as bf16::from_float, quieting NaN by setting bit 6 of the upper half.
__m128i cvt_f32_bf16(__m256 f) {
  const __m256i u = _mm256_castps_si256(f);
  const __m256i upper = _mm256_srli_epi32(u, 16);
  const __m256i lsb = _mm256_and_si256(upper, _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
  // |u| fits in 31 bits, so the signed compare is the unsigned one.
  const __m256i nan =
      _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
  const __m256i r = _mm256_blendv_epi8(rounded, _mm256_or_si256(upper, _mm256_set1_epi32(0x40)), nan);
  // Every value is below 2^16, so the unsigned saturating pack only narrows.
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

__m256 cvt_bf16_f32(__m128i b) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(b), 16));
}

// Loads `count` (≤ 8) bf16 values, zero-filling the rest.
__m256 load_bf16(const bf16* p, int64_t count) {
  if (count >= kW) return cvt_bf16_f32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  alignas(16) uint16_t buf[kW] = {};
  std::memcpy(buf, p, static_cast<size_t>(count) * sizeof(bf16));
  return cvt_bf16_f32(_mm_load_si128(reinterpret_cast<const __m128i*>(buf)));
}

void store_bf16(bf16* p, int64_t count, __m256 v) {
  const __m128i b = cvt_f32_bf16(v);
  if (count >= kW) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), b);
    return;
  }
  alignas(16) uint16_t buf[kW];
  _mm_store_si128(reinterpret_cast<__m128i*>(buf), b);
  std::memcpy(p, buf, static_cast<size_t>(count) * sizeof(bf16));
}

__m256 load(const float* p, int64_t count) {
  return count >= kW ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, tail_mask(count));
}

void store(float* p, int64_t count, __m256 v) {
  if (count >= kW) {
    _mm256_storeu_ps(p, v);
  } else {
    _mm256_maskstore_ps(p, tail_mask(count), v);
  }
}

// f(x) over n floats, 8 at a time; the last register is masked.
template <class F>
void map_f32(const float* in, float* out, int64_t n, F f) {
  for (int64_t i = 0; i < n; i += kW) store(out + i, n - i, f(load(in + i, n - i)));
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
      const int64_t count = cols - c;
      store(y + c, count, f(_mm256_add_ps(load(x + c, count), load(bias + c, count))));
    }
  }
}

template <class F>
void act_backward_map(const float* pre, const float* dout, float* din, int64_t n, F grad) {
  for (int64_t i = 0; i < n; i += kW) {
    const int64_t count = n - i;
    store(din + i, count, _mm256_mul_ps(load(dout + i, count), grad(load(pre + i, count))));
  }
}

void check_size(int64_t n) {
  XMOE_CHECK(n >= 0, "element-wise kernel: negative length ", n);
}

}  // namespace

void softmax_rows_f32(const float* in, float* out, int64_t rows, int64_t cols) {
  XMOE_CHECK(rows >= 0 && cols >= 0, "softmax_rows_f32: negative shape [", rows, ", ", cols, "]");
  const __m256 neg_inf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t r = 0; r < rows; ++r) {
    if (cols == 0) break;
    const float* x = in + r * cols;
    float* y = out + r * cols;
    // The max is exact in any order; a NaN anywhere makes the whole row NaN through the sum whatever it
    // picks.
    __m256 vmax = neg_inf;
    for (int64_t c = 0; c < cols; c += kW) {
      const int64_t count = cols - c;
      __m256 v = load(x + c, count);
      if (count < kW) v = _mm256_blendv_ps(neg_inf, v, _mm256_castsi256_ps(tail_mask(count)));
      vmax = _mm256_max_ps(vmax, v);
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
    const __m256 mx = _mm256_set1_ps(_mm_cvtss_f32(m4));

    __m256 acc[kRegs];
    for (auto& a : acc) a = _mm256_setzero_ps();
    for (int64_t base = 0; base < cols; base += kLanes) {
      for (int64_t k = 0; k < kRegs; ++k) {
        const int64_t c = base + k * kW;
        if (c >= cols) break;
        const int64_t count = cols - c;
        __m256 e = exp_ps(_mm256_sub_ps(load(x + c, count), mx));
        // Lanes past the row hold exp(0 − max): zero them so that the sum skips them, as the reference does.
        if (count < kW) e = _mm256_and_ps(e, _mm256_castsi256_ps(tail_mask(count)));
        acc[k] = _mm256_add_ps(acc[k], e);
        store(y + c, count, e);
      }
    }
    const __m256 sum = _mm256_set1_ps(reduce_lanes(acc));
    map_f32(y, y, cols, [&](__m256 e) { return _mm256_div_ps(e, sum); });
  }
}

void bias_act_f32(Activation act, const float* in, const float* bias, float* out, int64_t rows,
                  int64_t cols) {
  XMOE_CHECK(rows >= 0 && cols >= 0, "bias_act_f32: negative shape [", rows, ", ", cols, "]");
  switch (act) {
    case Activation::identity:
      bias_act_rows(in, bias, out, rows, cols, [](__m256 v) { return v; });
      return;
    case Activation::relu:
      // 0 > v ? 0 : v, the reference's form: NaN and −0 pass through unchanged.
      bias_act_rows(in, bias, out, rows, cols,
                    [](__m256 v) { return _mm256_max_ps(_mm256_setzero_ps(), v); });
      return;
    case Activation::gelu:
      bias_act_rows(in, bias, out, rows, cols, [](__m256 v) { return gelu_ps(v); });
      return;
    case Activation::silu:
      bias_act_rows(in, bias, out, rows, cols, [](__m256 v) { return silu_ps(v); });
      return;
  }
  XMOE_CHECK(false, "bias_act_f32: unknown activation ", static_cast<int>(act));
}

void act_backward_f32(Activation act, const float* pre, const float* dout, float* din, int64_t n) {
  check_size(n);
  switch (act) {
    case Activation::identity:
      map_f32(dout, din, n, [](__m256 v) { return v; });
      return;
    case Activation::relu:
      // A select, not dout·(pre > 0): inf or NaN gradients at pre ≤ 0 must give 0, not NaN.
      for (int64_t i = 0; i < n; i += kW) {
        const int64_t count = n - i;
        const __m256 pos = _mm256_cmp_ps(load(pre + i, count), _mm256_setzero_ps(), _CMP_GT_OQ);
        store(din + i, count, _mm256_and_ps(pos, load(dout + i, count)));
      }
      return;
    case Activation::gelu:
      act_backward_map(pre, dout, din, n, [](__m256 p) { return gelu_grad_ps(p); });
      return;
    case Activation::silu:
      act_backward_map(pre, dout, din, n, [](__m256 p) { return silu_grad_ps(p); });
      return;
  }
  XMOE_CHECK(false, "act_backward_f32: unknown activation ", static_cast<int>(act));
}

void silu_mul_f32(const float* g, const float* u, float* out, int64_t n) {
  check_size(n);
  for (int64_t i = 0; i < n; i += kW) {
    const int64_t count = n - i;
    store(out + i, count, _mm256_mul_ps(silu_ps(load(g + i, count)), load(u + i, count)));
  }
}

void silu_mul_backward_f32(const float* g, const float* u, const float* dout, float* dg, float* du,
                           int64_t n) {
  check_size(n);
  for (int64_t i = 0; i < n; i += kW) {
    const int64_t count = n - i;
    const __m256 gv = load(g + i, count);
    const __m256 uv = load(u + i, count);
    const __m256 d = load(dout + i, count);
    // All loads precede the stores, so dg or du may be the same array as an input.
    const __m256 dgv = _mm256_mul_ps(_mm256_mul_ps(d, uv), silu_grad_ps(gv));
    const __m256 duv = _mm256_mul_ps(d, silu_ps(gv));
    store(dg + i, count, dgv);
    store(du + i, count, duv);
  }
}

void f32_to_bf16(const float* in, bf16* out, int64_t n) {
  check_size(n);
  for (int64_t i = 0; i < n; i += kW) store_bf16(out + i, n - i, load(in + i, n - i));
}

void bf16_to_f32(const bf16* in, float* out, int64_t n) {
  check_size(n);
  for (int64_t i = 0; i < n; i += kW) store(out + i, n - i, load_bf16(in + i, n - i));
}

void scale_f32(float a, const float* x, float* y, int64_t n) {
  check_size(n);
  const __m256 va = _mm256_set1_ps(a);
  map_f32(x, y, n, [&](__m256 v) { return _mm256_mul_ps(va, v); });
}

void axpy_f32(float a, const float* x, float* y, int64_t n) {
  check_size(n);
  const __m256 va = _mm256_set1_ps(a);
  for (int64_t i = 0; i < n; i += kW) {
    const int64_t count = n - i;
    store(y + i, count, _mm256_fmadd_ps(va, load(x + i, count), load(y + i, count)));
  }
}

float dot_f32(const float* a, const float* b, int64_t n) {
  check_size(n);
  __m256 acc[kRegs];
  for (auto& v : acc) v = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int64_t k = 0; k < kRegs; ++k) {
      acc[k] = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + k * kW), _mm256_loadu_ps(b + i + k * kW), acc[k]);
    }
  }
  // Lanes past n load as 0: 0·0 added to a lane sum leaves it bit-identical (a lane sum is never −0), as the
  // reference, which skips them.
  for (int64_t k = 0; i + k * kW < n; ++k) {
    const int64_t c = i + k * kW;
    acc[k] = _mm256_fmadd_ps(load(a + c, n - c), load(b + c, n - c), acc[k]);
  }
  return reduce_lanes(acc);
}

void scale_bf16(float a, const bf16* x, bf16* y, int64_t n) {
  check_size(n);
  const __m256 va = _mm256_set1_ps(a);
  for (int64_t i = 0; i < n; i += kW) store_bf16(y + i, n - i, _mm256_mul_ps(va, load_bf16(x + i, n - i)));
}

void axpy_bf16_f32(float a, const bf16* x, float* y, int64_t n) {
  check_size(n);
  const __m256 va = _mm256_set1_ps(a);
  for (int64_t i = 0; i < n; i += kW) {
    const int64_t count = n - i;
    store(y + i, count, _mm256_fmadd_ps(va, load_bf16(x + i, count), load(y + i, count)));
  }
}

float dot_bf16_f32(const bf16* a, const float* b, int64_t n) {
  check_size(n);
  __m256 acc[kRegs];
  for (auto& v : acc) v = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int64_t k = 0; k < kRegs; ++k) {
      acc[k] = _mm256_fmadd_ps(load_bf16(a + i + k * kW, kW), _mm256_loadu_ps(b + i + k * kW), acc[k]);
    }
  }
  for (int64_t k = 0; i + k * kW < n; ++k) {
    const int64_t c = i + k * kW;
    acc[k] = _mm256_fmadd_ps(load_bf16(a + c, n - c), load(b + c, n - c), acc[k]);
  }
  return reduce_lanes(acc);
}

}  // namespace xmoe::kernels::avx2
