// AVX2 row-wise top-k, equal to topk_reference.cpp's ids exactly: the 8-lane twin of topk_avx512.cpp (see
// there for the int32 keys and the INT32_MIN "taken" mark).
//  * cols ≤ 8: 8 / G rows share one register in groups of G lanes (G = cols rounded up to a power of two);
//    group maxima are butterflies, the first maximal lane of each group is isolated with mask arithmetic on
//    the movemask bits, and each group's pick is written from those bits.
//  * cols > 8: the row's keys are kept in a buffer (on the stack up to 1024 columns); each pick is a
//    max-reduction over it, an unsigned lane-wise min over the columns holding the maximum (no branch depends
//    on the data), and the pick's vector rewritten with that lane taken.
// Loads are masked (maskload), so nothing past the scores is read.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/cpu/variants.hpp"
#include "kernels/cpu/vector_math_avx2.hpp"

namespace xmoe::kernels::avx2 {

namespace {

constexpr int64_t kW = 8;  // floats per register

// Signed key of the reference's order: |x| for x ≥ 0, −|x| for x < 0 (−0 and +0 both map to 0), INT32_MAX for
// every NaN; INT32_MIN stays free as the "taken" mark.
inline __m256i to_key(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i a = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
  const __m256i key = _mm256_sign_epi32(a, u);  // −a where u < 0; u == 0 only where a == 0
  const __m256i nan = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7f800000));
  return _mm256_blendv_epi8(key, _mm256_set1_epi32(INT32_MAX), nan);
}

// Every lane gets the maximum of its group of G lanes (G a power of two).
template <int G>
inline __m256i group_max(__m256i v) {
  if constexpr (G >= 2) v = _mm256_max_epi32(v, _mm256_shuffle_epi32(v, 0xb1));
  if constexpr (G >= 4) v = _mm256_max_epi32(v, _mm256_shuffle_epi32(v, 0x4e));
  if constexpr (G >= 8) v = _mm256_max_epi32(v, _mm256_permute2x128_si256(v, v, 0x01));
  return v;
}

// Every lane gets the unsigned minimum of all 8 lanes.
template <int G>
inline __m256i group_min(__m256i v) {
  static_assert(G == 8);
  v = _mm256_min_epu32(v, _mm256_shuffle_epi32(v, 0xb1));
  v = _mm256_min_epu32(v, _mm256_shuffle_epi32(v, 0x4e));
  return _mm256_min_epu32(v, _mm256_permute2x128_si256(v, v, 0x01));
}

inline uint32_t eq_mask(__m256i a, __m256i b) {
  return static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(a, b))));
}

template <int G>
void topk_small(const float* scores, int64_t rows, int64_t cols, int k, int32_t* ids, int64_t ids_stride) {
  constexpr int64_t R = kW / G;  // rows per register
  alignas(32) int32_t perm[kW], valid[kW];
  uint32_t first = 0;  // the first lane of each group
  for (int l = 0; l < kW; ++l) {
    const int g = l / G, c = l % G;
    perm[l] = c < cols ? static_cast<int32_t>(g * cols + c) : 0;
    valid[l] = c < cols ? -1 : 0;
    if (c == 0) first |= 1u << l;
  }
  const __m256i permv = _mm256_load_si256(reinterpret_cast<const __m256i*>(perm));
  const __m256i validv = _mm256_load_si256(reinterpret_cast<const __m256i*>(valid));
  const __m256i bits = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const __m256i taken = _mm256_set1_epi32(INT32_MIN);
  for (int64_t r = 0; r < rows; r += R) {
    const int64_t rr = std::min(R, rows - r);
    __m256 x = _mm256_maskload_ps(scores + r * cols, tail_mask(rr * cols));
    if constexpr (G < kW) x = _mm256_permutevar8x32_ps(x, permv);
    __m256i key = _mm256_blendv_epi8(taken, to_key(x), validv);
    int32_t* out = ids + r;
    for (int j = 0; j < k; ++j, out += ids_stride) {
      // Every group holds its maximum, so no group's bits are zero and eq − first borrows within groups only:
      // eq & ~(eq − first) keeps the lowest set bit of each group.
      const uint32_t eq = eq_mask(key, group_max<G>(key));
      uint32_t sel = eq & ~(eq - first);
      const __m256i selv =
          _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(static_cast<int>(sel)), bits), bits);
      key = _mm256_blendv_epi8(key, taken, selv);
      for (int64_t g = 0; g < rr; ++g, sel &= sel - 1)
        out[g] = static_cast<int32_t>(__builtin_ctz(sel) - g * G);
    }
  }
}

void topk_large(const float* scores, int64_t rows, int64_t cols, int k, int32_t* ids, int64_t ids_stride) {
  const int64_t nv = (cols + kW - 1) / kW;
  constexpr int64_t kStackVectors = 128;  // up to 1024 columns without allocating
  alignas(32) int32_t stack[kStackVectors * kW];
  std::vector<int32_t> heap;
  int32_t* buf = stack;
  if (nv > kStackVectors) {
    heap.resize(static_cast<size_t>((nv + 1) * kW));
    const auto p = reinterpret_cast<uintptr_t>(heap.data());
    buf = reinterpret_cast<int32_t*>((p + 31) & ~uintptr_t{31});  // 32-byte aligned
  }
  const auto at = [buf](int64_t v) { return reinterpret_cast<__m256i*>(buf + v * kW); };
  const __m256i taken = _mm256_set1_epi32(INT32_MIN);
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (int64_t r = 0; r < rows; ++r) {
    const float* s = scores + r * cols;
    __m256i acc0 = taken, acc1 = taken;
    for (int64_t v = 0; v < nv; ++v) {
      const __m256i m = tail_mask(cols - v * kW);
      const __m256i key = _mm256_blendv_epi8(taken, to_key(_mm256_maskload_ps(s + v * kW, m)), m);
      _mm256_store_si256(at(v), key);
      if (v & 1) {
        acc1 = _mm256_max_epi32(acc1, key);
      } else {
        acc0 = _mm256_max_epi32(acc0, key);
      }
    }
    for (int j = 0; j < k; ++j) {
      if (j > 0) {
        acc0 = taken;
        acc1 = taken;
        int64_t v = 0;
        for (; v + 2 <= nv; v += 2) {
          acc0 = _mm256_max_epi32(acc0, _mm256_load_si256(at(v)));
          acc1 = _mm256_max_epi32(acc1, _mm256_load_si256(at(v + 1)));
        }
        if (v < nv) acc0 = _mm256_max_epi32(acc0, _mm256_load_si256(at(v)));
      }
      const __m256i best = group_max<kW>(_mm256_max_epi32(acc0, acc1));
      // The pick is the lowest column holding the maximum: an unsigned lane-wise min over the columns, with
      // the non-matching ones turned into 0xffffffff (no data-dependent branch, so the out-of-order core can
      // overlap consecutive rows).
      const __m256i ones = _mm256_set1_epi32(-1);
      __m256i first0 = ones, first1 = ones;
      __m256i col = lanes;
      const __m256i step = _mm256_set1_epi32(2 * kW), half = _mm256_set1_epi32(kW);
      const auto candidates = [&](int64_t w, __m256i c) {
        return _mm256_or_si256(c, _mm256_xor_si256(_mm256_cmpeq_epi32(_mm256_load_si256(at(w)), best), ones));
      };
      int64_t v = 0;
      for (; v + 2 <= nv; v += 2, col = _mm256_add_epi32(col, step)) {
        first0 = _mm256_min_epu32(first0, candidates(v, col));
        first1 = _mm256_min_epu32(first1, candidates(v + 1, _mm256_add_epi32(col, half)));
      }
      if (v < nv) first0 = _mm256_min_epu32(first0, candidates(v, col));
      const int32_t pick = _mm256_cvtsi256_si32(group_min<kW>(_mm256_min_epu32(first0, first1)));
      const int64_t pv = pick / kW;
      _mm256_store_si256(at(pv), _mm256_blendv_epi8(_mm256_load_si256(at(pv)), taken,
                                                    _mm256_cmpeq_epi32(lanes, _mm256_set1_epi32(pick % kW))));
      ids[j * ids_stride + r] = pick;
    }
  }
}

}  // namespace

void topk_rows_f32(const float* scores, int64_t rows, int64_t cols, int k, int32_t* ids, int64_t ids_stride) {
  if (cols <= 2) {
    topk_small<2>(scores, rows, cols, k, ids, ids_stride);
  } else if (cols <= 4) {
    topk_small<4>(scores, rows, cols, k, ids, ids_stride);
  } else if (cols <= 8) {
    topk_small<8>(scores, rows, cols, k, ids, ids_stride);
  } else {
    topk_large(scores, rows, cols, k, ids, ids_stride);
  }
}

}  // namespace xmoe::kernels::avx2
