// AVX-512 row-wise top-k, equal to topk_reference.cpp's ids exactly. Scores become int32 keys whose signed
// order is the reference's order (see to_key), so selection is integer max-reduction, the first lane equal to
// the maximum, and that lane set to INT32_MIN, which lies below every key: once only −inf scores are left,
// the lowest remaining column holding −inf is still chosen next. Each pick is exact, so ties go to the lower
// column as in the reference.
//  * cols ≤ 16: 16 / G rows share one register, each in a group of G lanes (G = cols rounded up to a power of
//    two, padding lanes = INT32_MIN); the maxima are butterflies within groups, the first maximal lane of
//    every group is isolated with mask arithmetic, and the k-th picks of all those rows go out with one
//    compress and one store (they are contiguous in the choice-major layout).
//  * 16 < cols ≤ 384: the row's keys stay in registers (two rows interleaved up to 256 columns); each pick is
//    a max-reduction, a lane-wise min over the columns holding the maximum, and a compare of every register's
//    column numbers with the pick; no branch depends on the data.
//  * cols > 384: the same over a buffer (on the stack up to 1024 columns), the pick's vector rewritten in it.
// Loads are masked, so nothing past the scores is read.

// GCC 12's AVX-512 intrinsics trip false -W(maybe-)uninitialized warnings on their internal
// _mm512_undefined_ps() (GCC bug 105593, fixed in GCC 13); it must be silenced before the intrinsics header
// is read.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <utility>
#include <vector>

#include "kernels/cpu/variants.hpp"
#include "kernels/cpu/vector_math_avx512.hpp"

namespace xmoe::kernels::avx512 {

namespace {

constexpr int64_t kW = 16;  // floats per register

// Signed key of the reference's order: |x| for x ≥ 0, −|x| for x < 0 (so −0 and +0 both map to 0; −inf to
// −0x7f800000), INT32_MAX for every NaN. INT32_MIN is left free as the "taken" mark.
inline __m512i to_key(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i a = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
  const __m512i key = _mm512_mask_sub_epi32(a, _mm512_movepi32_mask(u), _mm512_setzero_si512(), a);
  const __mmask16 nan = _mm512_cmpgt_epi32_mask(a, _mm512_set1_epi32(0x7f800000));
  return _mm512_mask_mov_epi32(key, nan, _mm512_set1_epi32(INT32_MAX));
}

// Every lane gets the maximum of its group of G lanes (G a power of two).
template <int G>
inline __m512i group_max(__m512i v) {
  if constexpr (G >= 2) v = _mm512_max_epi32(v, _mm512_shuffle_epi32(v, static_cast<_MM_PERM_ENUM>(0xb1)));
  if constexpr (G >= 4) v = _mm512_max_epi32(v, _mm512_shuffle_epi32(v, static_cast<_MM_PERM_ENUM>(0x4e)));
  if constexpr (G >= 8) v = _mm512_max_epi32(v, _mm512_shuffle_i32x4(v, v, 0xb1));
  if constexpr (G >= 16) v = _mm512_max_epi32(v, _mm512_shuffle_i32x4(v, v, 0x4e));
  return v;
}

template <int G>
inline __m512i group_min(__m512i v) {
  if constexpr (G >= 2) v = _mm512_min_epi32(v, _mm512_shuffle_epi32(v, static_cast<_MM_PERM_ENUM>(0xb1)));
  if constexpr (G >= 4) v = _mm512_min_epi32(v, _mm512_shuffle_epi32(v, static_cast<_MM_PERM_ENUM>(0x4e)));
  if constexpr (G >= 8) v = _mm512_min_epi32(v, _mm512_shuffle_i32x4(v, v, 0xb1));
  if constexpr (G >= 16) v = _mm512_min_epi32(v, _mm512_shuffle_i32x4(v, v, 0x4e));
  return v;
}

template <int G>
void topk_small(const float* scores, int64_t rows, int64_t cols, int k, int32_t* ids, int64_t ids_stride) {
  constexpr int64_t R = kW / G;  // rows per register
  alignas(64) int32_t perm[kW], lane[kW];
  uint32_t valid = 0, first = 0;  // lanes holding a column; the first lane of each group
  for (int l = 0; l < kW; ++l) {
    const int g = l / G, c = l % G;
    perm[l] = c < cols ? static_cast<int32_t>(g * cols + c) : 0;
    lane[l] = c;
    if (c < cols) valid |= 1u << l;
    if (c == 0) first |= 1u << l;
  }
  const __m512i permv = _mm512_load_si512(perm), lanev = _mm512_load_si512(lane);
  const __m512i taken = _mm512_set1_epi32(INT32_MIN);
  for (int64_t r = 0; r < rows; r += R) {
    const int64_t rr = std::min(R, rows - r);
    __m512 x = _mm512_maskz_loadu_ps(tail_mask(rr * cols), scores + r * cols);
    if constexpr (G < kW) x = _mm512_permutexvar_ps(permv, x);
    __m512i key = _mm512_mask_mov_epi32(taken, static_cast<__mmask16>(valid), to_key(x));
    const __mmask16 store = tail_mask(rr);
    int32_t* out = ids + r;
    for (int j = 0; j < k; ++j, out += ids_stride) {
      // Every group holds its maximum, so no group's bits are zero and eq − first borrows within groups only:
      // eq & ~(eq − first) keeps the lowest set bit of each group.
      const uint32_t eq = _mm512_cmpeq_epi32_mask(key, group_max<G>(key));
      const auto sel = static_cast<__mmask16>(eq & ~(eq - first));
      key = _mm512_mask_mov_epi32(key, sel, taken);
      _mm512_mask_storeu_epi32(out, store, _mm512_maskz_compress_epi32(sel, lanev));
    }
  }
}

void topk_large(const float* scores, int64_t rows, int64_t cols, int k, int32_t* ids, int64_t ids_stride) {
  const int64_t nv = (cols + kW - 1) / kW;
  constexpr int64_t kStackVectors = 64;  // up to 1024 columns without allocating
  alignas(64) int32_t stack[kStackVectors * kW];
  std::vector<int32_t> heap;
  int32_t* buf = stack;
  if (nv > kStackVectors) {
    heap.resize(static_cast<size_t>((nv + 1) * kW));
    const auto p = reinterpret_cast<uintptr_t>(heap.data());
    buf = reinterpret_cast<int32_t*>((p + 63) & ~uintptr_t{63});  // 64-byte aligned
  }
  const __m512i taken = _mm512_set1_epi32(INT32_MIN);
  for (int64_t r = 0; r < rows; ++r) {
    const float* s = scores + r * cols;
    __m512i acc0 = taken, acc1 = taken;
    for (int64_t v = 0; v < nv; ++v) {
      const __mmask16 m = tail_mask(cols - v * kW);
      const __m512i key = _mm512_mask_mov_epi32(taken, m, to_key(_mm512_maskz_loadu_ps(m, s + v * kW)));
      _mm512_store_si512(buf + v * kW, key);
      if (v & 1) {
        acc1 = _mm512_max_epi32(acc1, key);
      } else {
        acc0 = _mm512_max_epi32(acc0, key);
      }
    }
    for (int j = 0; j < k; ++j) {
      if (j > 0) {
        acc0 = taken;
        acc1 = taken;
        int64_t v = 0;
        for (; v + 2 <= nv; v += 2) {
          acc0 = _mm512_max_epi32(acc0, _mm512_load_si512(buf + v * kW));
          acc1 = _mm512_max_epi32(acc1, _mm512_load_si512(buf + (v + 1) * kW));
        }
        if (v < nv) acc0 = _mm512_max_epi32(acc0, _mm512_load_si512(buf + v * kW));
      }
      const __m512i best = group_max<kW>(_mm512_max_epi32(acc0, acc1));
      // The pick is the lowest column holding the maximum: a lane-wise min over the matching columns (no
      // data-dependent branch, so the out-of-order core can overlap consecutive rows).
      __m512i first0 = _mm512_set1_epi32(INT32_MAX), first1 = first0;
      __m512i col = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
      const __m512i step = _mm512_set1_epi32(2 * kW);
      int64_t v = 0;
      for (; v + 2 <= nv; v += 2, col = _mm512_add_epi32(col, step)) {
        first0 = _mm512_mask_min_epi32(first0, _mm512_cmpeq_epi32_mask(_mm512_load_si512(buf + v * kW), best),
                                       first0, col);
        first1 = _mm512_mask_min_epi32(first1,
                                       _mm512_cmpeq_epi32_mask(_mm512_load_si512(buf + (v + 1) * kW), best),
                                       first1, _mm512_add_epi32(col, _mm512_set1_epi32(kW)));
      }
      if (v < nv) {
        first0 = _mm512_mask_min_epi32(first0, _mm512_cmpeq_epi32_mask(_mm512_load_si512(buf + v * kW), best),
                                       first0, col);
      }
      const int32_t pick = _mm512_cvtsi512_si32(group_min<kW>(_mm512_min_epi32(first0, first1)));
      int32_t* at = buf + (pick & ~(kW - 1));
      _mm512_store_si512(at, _mm512_mask_mov_epi32(_mm512_load_si512(at),
                                                   static_cast<__mmask16>(1u << (pick & (kW - 1))), taken));
      ids[j * ids_stride + r] = pick;
    }
  }
}

// cols in (16 (NV − 1), 16 NV]: the row's keys stay in NV registers (no store-to-load round trip between
// picks), and the taken column is marked by comparing every register's column numbers with the pick, which
// stays in a register too. Each pick is a chain of dependent reductions, so P rows are interleaved to give
// the core independent work.
template <int NV, int P>
void topk_regs_rows(const float* scores, int64_t cols, int k, int32_t* ids, int64_t ids_stride) {
  const __m512i taken = _mm512_set1_epi32(INT32_MIN);
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  __m512i x[P][NV];
#pragma GCC unroll 4
  for (int p = 0; p < P; ++p) {
#pragma GCC unroll 32
    for (int v = 0; v < NV; ++v) {
      const __mmask16 m = tail_mask(cols - v * kW);
      x[p][v] = _mm512_mask_mov_epi32(taken, m, to_key(_mm512_maskz_loadu_ps(m, scores + p * cols + v * kW)));
    }
  }
  for (int j = 0; j < k; ++j) {
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) {
      __m512i acc[NV];
#pragma GCC unroll 32
      for (int v = 0; v < NV; ++v) acc[v] = x[p][v];
#pragma GCC unroll 32
      for (int w = 1; w < NV; w *= 2) {  // pairwise tree
#pragma GCC unroll 32
        for (int v = 0; v + w < NV; v += 2 * w) acc[v] = _mm512_max_epi32(acc[v], acc[v + w]);
      }
      const __m512i best = group_max<kW>(acc[0]);
      // The pick is the lowest column holding the maximum.
      __m512i first = _mm512_set1_epi32(INT32_MAX);
#pragma GCC unroll 32
      for (int v = 0; v < NV; ++v) {
        first = _mm512_mask_min_epi32(first, _mm512_cmpeq_epi32_mask(x[p][v], best), first,
                                      _mm512_add_epi32(lane, _mm512_set1_epi32(v * kW)));
      }
      const __m512i pick = group_min<kW>(first);  // in every lane
      ids[j * ids_stride + p] = _mm512_cvtsi512_si32(pick);
#pragma GCC unroll 32
      for (int v = 0; v < NV; ++v) {
        const __m512i col = _mm512_add_epi32(lane, _mm512_set1_epi32(v * kW));
        x[p][v] = _mm512_mask_mov_epi32(x[p][v], _mm512_cmpeq_epi32_mask(col, pick), taken);
      }
    }
  }
}

template <int NV>
void topk_regs(const float* scores, int64_t rows, int64_t cols, int k, int32_t* ids, int64_t ids_stride) {
  constexpr int P = NV <= 16 ? 2 : 1;  // two rows while both fit the 32 registers
  int64_t r = 0;
  for (; r + P <= rows; r += P) topk_regs_rows<NV, P>(scores + r * cols, cols, k, ids + r, ids_stride);
  for (; r < rows; ++r) topk_regs_rows<NV, 1>(scores + r * cols, cols, k, ids + r, ids_stride);
}

using TopKFn = void (*)(const float*, int64_t, int64_t, int, int32_t*, int64_t);
constexpr int kMaxRegs = 24;  // up to 384 columns in registers

template <int... I>
constexpr auto make_regs_table(std::integer_sequence<int, I...>) {
  return std::array<TopKFn, sizeof...(I)>{topk_regs<I + 1>...};
}
constexpr auto kRegsTable = make_regs_table(std::make_integer_sequence<int, kMaxRegs>{});

}  // namespace

void topk_rows_f32(const float* scores, int64_t rows, int64_t cols, int k, int32_t* ids, int64_t ids_stride) {
  if (cols <= 2) {
    topk_small<2>(scores, rows, cols, k, ids, ids_stride);
  } else if (cols <= 4) {
    topk_small<4>(scores, rows, cols, k, ids, ids_stride);
  } else if (cols <= 8) {
    topk_small<8>(scores, rows, cols, k, ids, ids_stride);
  } else if (cols <= 16) {
    topk_small<16>(scores, rows, cols, k, ids, ids_stride);
  } else if (cols <= kMaxRegs * kW) {
    kRegsTable[static_cast<size_t>((cols - 1) / kW)](scores, rows, cols, k, ids, ids_stride);
  } else {
    topk_large(scores, rows, cols, k, ids, ids_stride);
  }
}

}  // namespace xmoe::kernels::avx512
