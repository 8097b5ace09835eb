// The attention work item's inner loops over vectors of V::kWidth floats (V: a level's vector type and the
// few operations needed), shared by attention_avx2.cpp and attention_avx512.cpp. Register blocks: scores
// V::kScoreRows positions × QV vectors of queries, probabilities × V V::kRowBlock query rows × CV vectors of
// V columns, sized to the level's register file. Each result element is one FMA
// chain in a fixed order whichever block (full or remainder) computes it.
#pragma once
#include <limits>

#include "kernels/cpu/attention_tile.hpp"

namespace xmoe::kernels::attention_detail {
namespace {

template <class V>
struct SimdOps {
  using T = typename V::T;
  static constexpr int64_t kLanes = V::kWidth;
  static constexpr int kScoreRows = V::kScoreRows, kRowBlock = V::kRowBlock;
  static_assert(kAttentionChunk % kScoreRows == 0);

  static void widen(const uint16_t* src, float* dst, int64_t n) {
    int64_t j = 0;
    for (; j + kLanes <= n; j += kLanes) V::store(dst + j, V::load_bf16(src + j));
    widen_bf16(src, dst, j, n);
  }

  // K rows kf_ld floats apart: LD when that is a compile-time constant (0: kf_ld), so each row's loads are
  // one pointer plus a fixed displacement rather than a register per row (8 row pointers spilled to the stack
  // and were reloaded at every d, a load per FMA on top of the broadcast's).
  template <int64_t LD>
  static int64_t row_stride(int64_t kf_ld) {
    return LD > 0 ? LD : kf_ld;
  }

  template <int QV, int64_t LD>
  static void qk_block(const float* qt, int64_t mp, int64_t i0, const float* kf, int64_t kf_ld, int dk,
                       float scale, float* s) {
    const int64_t ld = row_stride<LD>(kf_ld);
    for (int p0 = 0; p0 < kAttentionChunk; p0 += kScoreRows) {
      T acc[kScoreRows][QV];
      for (auto& row : acc)
        for (T& x : row) x = V::zero();
      const float* k = kf + p0 * ld;
      for (int d = 0; d < dk; ++d) {
        T q[QV];
        for (int v = 0; v < QV; ++v) q[v] = V::load(qt + d * mp + i0 + v * V::kWidth);
        for (int p = 0; p < kScoreRows; ++p) {
          const T kb = V::set1(k[p * ld + d]);
          for (int v = 0; v < QV; ++v) acc[p][v] = V::fma(kb, q[v], acc[p][v]);
        }
      }
      for (int p = 0; p < kScoreRows; ++p)
        for (int v = 0; v < QV; ++v)
          V::store(s + (p0 + p) * mp + i0 + v * V::kWidth, V::mul(acc[p][v], V::set1(scale)));
    }
  }

  // Scores of at most half a vector of queries (decode: one GQA group of 8 heads on AVX-512) in half-width
  // vectors: a 512-bit FMA with half its lanes idle costs a full one (two 256-bit halves on Zen 4). Each
  // score is the same FMA chain as in qk_block, so the bits do not change; lanes [V::Half::kWidth, mp) of s
  // are left as they were (no query reads them).
  template <class H, int64_t LD>
  static void qk_half(const float* qt, int64_t mp, const float* kf, int64_t kf_ld, int dk, float scale,
                      float* s) {
    constexpr int kRows = 8;  // positions per pass
    static_assert(kAttentionChunk % kRows == 0);
    const int64_t ld = row_stride<LD>(kf_ld);
    for (int p0 = 0; p0 < kAttentionChunk; p0 += kRows) {
      typename H::T acc[kRows];
      for (auto& x : acc) x = H::zero();
      const float* k = kf + p0 * ld;
      for (int d = 0; d < dk; ++d) {
        const typename H::T q = H::load(qt + d * mp);
        for (int p = 0; p < kRows; ++p) acc[p] = H::fma(H::set1(k[p * ld + d]), q, acc[p]);
      }
      for (int p = 0; p < kRows; ++p) H::store(s + (p0 + p) * mp, H::mul(acc[p], H::set1(scale)));
    }
  }

  template <int64_t LD>
  static void qk_at(const float* qt, int64_t mp, int64_t queries, int64_t lanes, const float* kf,
                    int64_t kf_ld, int dk, float scale, float* s) {
    if constexpr (requires { typename V::Half; }) {
      if (queries <= V::Half::kWidth) {
        qk_half<typename V::Half, LD>(qt, mp, kf, kf_ld, dk, scale, s);
        return;
      }
    }
    int64_t i = 0;
    for (; i + 2 * kLanes <= lanes; i += 2 * kLanes) qk_block<2, LD>(qt, mp, i, kf, kf_ld, dk, scale, s);
    if (i < lanes) qk_block<1, LD>(qt, mp, i, kf, kf_ld, dk, scale, s);
  }

  // Head widths of 64 and 128 (Qwen3, Llama, gpt-oss, ...) get their row stride as a constant.
  static void qk(const float* qt, int64_t mp, int64_t queries, int64_t lanes, const float* kf, int64_t kf_ld,
                 int dk, float scale, float* s) {
    if (kf_ld == 128) return qk_at<128>(qt, mp, queries, lanes, kf, kf_ld, dk, scale, s);
    if (kf_ld == 64) return qk_at<64>(qt, mp, queries, lanes, kf, kf_ld, dk, scale, s);
    qk_at<0>(qt, mp, queries, lanes, kf, kf_ld, dk, scale, s);
  }

  static void softmax_step(float* s, int64_t mp, int64_t lanes, float* m, float* l, float* alpha) {
    const T neg_inf = V::set1(-std::numeric_limits<float>::infinity()), one = V::set1(1.0f);
    for (int64_t i = 0; i < lanes; i += kLanes) {
      const T mo = V::load(m + i);
      T mx = mo;
      for (int p = 0; p < kAttentionChunk; ++p) mx = V::max(mx, V::load(s + p * mp + i));
      // Unchanged max: exactly 1, so a chunk a query cannot see changes nothing; nothing seen yet: 1 and
      // zero probabilities (exp(−inf − −inf) would be NaN).
      T a = V::select_eq(mx, mo, one, V::exp(V::sub(mo, mx)));
      a = V::select_eq(mx, neg_inf, one, a);
      T sum = V::zero();
      for (int p = 0; p < kAttentionChunk; ++p) {
        float* sp = s + p * mp + i;
        const T e = V::select_eq(mx, neg_inf, V::zero(), V::exp(V::sub(V::load(sp), mx)));
        V::store(sp, e);
        sum = V::add(sum, e);
      }
      V::store(l + i, V::add(V::mul(V::load(l + i), a), sum));
      V::store(m + i, mx);
      V::store(alpha + i, a);
    }
  }

  static void scale_row(float* o, float a, int64_t n) {
    for (int64_t c = 0; c < n; c += kLanes) V::store(o + c, V::mul(V::load(o + c), V::set1(a)));
  }

  template <int R, int CV>
  static void pv_block(const float* s, int64_t mp, int64_t i0, const float* vf, int64_t dvp, int64_t c0,
                       float* o) {
    T acc[R][CV];
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < CV; ++v) acc[r][v] = V::load(o + (i0 + r) * dvp + c0 + v * V::kWidth);
    for (int p = 0; p < kAttentionChunk; ++p) {
      T x[CV];
      for (int v = 0; v < CV; ++v) x[v] = V::load(vf + p * dvp + c0 + v * V::kWidth);
      for (int r = 0; r < R; ++r) {
        const T w = V::set1(s[p * mp + i0 + r]);
        for (int v = 0; v < CV; ++v) acc[r][v] = V::fma(w, x[v], acc[r][v]);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < CV; ++v) V::store(o + (i0 + r) * dvp + c0 + v * V::kWidth, acc[r][v]);
  }

  // Rows [i, i + R') for the R' = rows − i < kRowBlock left over.
  template <int R, int CV>
  static void pv_tail(const float* s, int64_t mp, int64_t i, int64_t rest, const float* vf, int64_t dvp,
                      int64_t c0, float* o) {
    if constexpr (R > 0) {
      if (rest == R)
        pv_block<R, CV>(s, mp, i, vf, dvp, c0, o);
      else
        pv_tail<R - 1, CV>(s, mp, i, rest, vf, dvp, c0, o);
    }
  }

  template <int CV>
  static void pv_rows(const float* s, int64_t mp, int64_t rows, const float* vf, int64_t dvp, int64_t c0,
                      float* o) {
    int64_t i = 0;
    for (; i + kRowBlock <= rows; i += kRowBlock) pv_block<kRowBlock, CV>(s, mp, i, vf, dvp, c0, o);
    pv_tail<kRowBlock - 1, CV>(s, mp, i, rows - i, vf, dvp, c0, o);
  }

  static void pv(const float* s, int64_t mp, int64_t rows, const float* vf, int64_t dvp, float* o) {
    int64_t c = 0;
    for (; c + 2 * kLanes <= dvp; c += 2 * kLanes) pv_rows<2>(s, mp, rows, vf, dvp, c, o);
    if (c < dvp) pv_rows<1>(s, mp, rows, vf, dvp, c, o);
  }
};

}  // namespace
}  // namespace xmoe::kernels::attention_detail
