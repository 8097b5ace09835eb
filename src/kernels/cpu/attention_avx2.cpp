// The attention work item with AVX2+FMA vectors (8 floats).
#include <immintrin.h>

#include "kernels/cpu/attention_simd.hpp"
#include "kernels/cpu/variants.hpp"
#include "kernels/cpu/vector_math_avx2.hpp"

namespace xmoe::kernels::avx2 {

namespace {

struct Vec {
  using T = __m256;
  // 16 ymm registers: 8 score or 12 output accumulators.
  static constexpr int kScoreRows = 4, kRowBlock = 6;
  static constexpr int kWidth = 8;
  static T load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, T x) { _mm256_storeu_ps(p, x); }
  static T set1(float x) { return _mm256_set1_ps(x); }
  static T load_bf16(const uint16_t* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static T zero() { return _mm256_setzero_ps(); }
  static T fma(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }
  static T add(T a, T b) { return _mm256_add_ps(a, b); }
  static T sub(T a, T b) { return _mm256_sub_ps(a, b); }
  static T mul(T a, T b) { return _mm256_mul_ps(a, b); }
  static T max(T a, T b) { return _mm256_max_ps(a, b); }
  static T exp(T x) { return exp_ps(x); }
  // a == b ? x : y, lane by lane
  static T select_eq(T a, T b, T x, T y) { return _mm256_blendv_ps(y, x, _mm256_cmp_ps(a, b, _CMP_EQ_OQ)); }
};

}  // namespace

void attention_tile(const AttentionArgs& args, const AttentionItem& item, float* scratch) {
  attention_detail::attention_tile<attention_detail::SimdOps<Vec>>(args, item, scratch);
}

}  // namespace xmoe::kernels::avx2
