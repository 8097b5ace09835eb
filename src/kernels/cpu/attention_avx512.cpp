// The attention work item with AVX-512 vectors (16 floats).
#include <immintrin.h>

#include <cstdint>
#include <cstring>

// GCC 12 reports the _mm512_undefined_ps() inside its own max/min intrinsics as maybe-uninitialized once they
// are inlined into the softmax loop (a false positive: every lane is written).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "kernels/cpu/attention_simd.hpp"
#include "kernels/cpu/variants.hpp"
#include "kernels/cpu/vector_math_avx512.hpp"

namespace xmoe::kernels::avx512 {

namespace {

struct Vec {
  using T = __m512;
  // 256-bit vectors (AVX512VL encodings) for the scores of up to 8 queries.
  struct Half {
    using T = __m256;
    static constexpr int kWidth = 8;
    static T load(const float* p) { return _mm256_loadu_ps(p); }
    static void store(float* p, T x) { _mm256_storeu_ps(p, x); }
    static T set1(float x) { return _mm256_set1_ps(x); }
    static T zero() { return _mm256_setzero_ps(); }
    static T fma(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }
    static T mul(T a, T b) { return _mm256_mul_ps(a, b); }
    // Two bf16 values (p[0], p[1]) in every 32-bit lane; as f32: the lane shifted left by 16, and the lane
    // with its low half cleared.
    static T broadcast_pair(const uint16_t* p) {
      uint32_t bits;
      std::memcpy(&bits, p, sizeof bits);
      return _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(bits)));
    }
    static T low_bf16(T pair) {
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_castps_si256(pair), 16));
    }
    static T high_bf16(T pair) {
      return _mm256_castsi256_ps(
          _mm256_and_si256(_mm256_castps_si256(pair), _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))));
    }
  };
  // 32 zmm registers: 16 score or 24 output accumulators.
  static constexpr int kScoreRows = 8, kRowBlock = 12;
  static constexpr int kWidth = 16;
  static T load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, T x) { _mm512_storeu_ps(p, x); }
  static T set1(float x) { return _mm512_set1_ps(x); }
  static T load_bf16(const uint16_t* p) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static T zero() { return _mm512_setzero_ps(); }
  static T fma(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }
  static T add(T a, T b) { return _mm512_add_ps(a, b); }
  static T sub(T a, T b) { return _mm512_sub_ps(a, b); }
  static T mul(T a, T b) { return _mm512_mul_ps(a, b); }
  static T max(T a, T b) { return _mm512_max_ps(a, b); }
  static T exp(T x) { return exp_ps(x); }
  // a == b ? x : y, lane by lane
  static T select_eq(T a, T b, T x, T y) {
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ), y, x);
  }
};

}  // namespace

void attention_tile(const AttentionArgs& args, const AttentionItem& item, float* scratch) {
  attention_detail::attention_tile<attention_detail::SimdOps<Vec>>(args, item, scratch);
}

}  // namespace xmoe::kernels::avx512
