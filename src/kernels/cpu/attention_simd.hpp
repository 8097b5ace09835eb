// The attention work item's inner loops over vectors of V::kWidth floats (V: a level's vector type and the
// few operations needed), shared by attention_avx2.cpp and attention_avx512.cpp. Register blocks: scores
// V::kScoreRows positions × QV vectors of queries, probabilities × V V::kRowBlock query rows × CV vectors of
// V columns, sized to the level's register file. Each result element is one FMA
// chain in a fixed order whichever block (full or remainder) computes it.
#pragma once
#include <limits>

#include "kernels/cpu/attention_tile.hpp"
#include "xmoe/dtype.hpp"

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

  // V rows for probabilities × V: the chunk widened to f32 (vf, rows dvp apart), or straight from the bf16
  // cache (rows ld elements apart; rows past count read as zero, as the widened chunk's padding rows are).
  struct F32Rows {
    const float* vf;
    int64_t dvp;
    T load(int p, int64_t col) const { return V::load(vf + p * dvp + col); }
  };
  struct Bf16Rows {
    const uint16_t* v;
    int64_t ld, count;
    T load(int p, int64_t col) const { return p < count ? V::load_bf16(v + p * ld + col) : V::zero(); }
  };

  template <int R, int CV, class Rows>
  static void pv_block(const float* s, int64_t mp, int64_t i0, const Rows& rows, int64_t dvp, int64_t c0,
                       float* o) {
    T acc[R][CV];
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < CV; ++v) acc[r][v] = V::load(o + (i0 + r) * dvp + c0 + v * V::kWidth);
    for (int p = 0; p < kAttentionChunk; ++p) {
      T x[CV];
      for (int v = 0; v < CV; ++v) x[v] = rows.load(p, c0 + v * V::kWidth);
      for (int r = 0; r < R; ++r) {
        const T w = V::set1(s[p * mp + i0 + r]);
        for (int v = 0; v < CV; ++v) acc[r][v] = V::fma(w, x[v], acc[r][v]);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < CV; ++v) V::store(o + (i0 + r) * dvp + c0 + v * V::kWidth, acc[r][v]);
  }

  // Rows [i, i + R') for the R' = rows − i < kRowBlock left over.
  template <int R, int CV, class Rows>
  static void pv_tail(const float* s, int64_t mp, int64_t i, int64_t rest, const Rows& rows, int64_t dvp,
                      int64_t c0, float* o) {
    if constexpr (R > 0) {
      if (rest == R)
        pv_block<R, CV>(s, mp, i, rows, dvp, c0, o);
      else
        pv_tail<R - 1, CV>(s, mp, i, rest, rows, dvp, c0, o);
    }
  }

  template <int CV, class Rows>
  static void pv_rows(const float* s, int64_t mp, int64_t n, const Rows& rows, int64_t dvp, int64_t c0,
                      float* o) {
    int64_t i = 0;
    for (; i + kRowBlock <= n; i += kRowBlock) pv_block<kRowBlock, CV>(s, mp, i, rows, dvp, c0, o);
    pv_tail<kRowBlock - 1, CV>(s, mp, i, n - i, rows, dvp, c0, o);
  }

  template <class Rows>
  static void pv_from(const float* s, int64_t mp, int64_t n, const Rows& rows, int64_t dvp, float* o) {
    int64_t c = 0;
    for (; c + 2 * kLanes <= dvp; c += 2 * kLanes) pv_rows<2>(s, mp, n, rows, dvp, c, o);
    if (c < dvp) pv_rows<1>(s, mp, n, rows, dvp, c, o);
  }

  static void pv(const float* s, int64_t mp, int64_t rows, const float* vf, int64_t dvp, float* o) {
    pv_from(s, mp, rows, F32Rows{vf, dvp}, dvp, o);
  }

  // Decode (one GQA group of at most half a vector of queries) reads a bf16 cache's chunk in place instead of
  // widening it to f32 first: the widening pass took 60 % of a decode item's time (perf, 16 sequences at a
  // context of 512, Zen 4), and with 8 queries each widened value is used only 8 times. Needs K and V widths
  // that are whole vectors (no row is read past its end). The same FMA chains, so the same bits.
  static constexpr bool kReadsBf16InPlace = requires { typename V::Half; };
  static bool reads_bf16_in_place(const AttentionArgs& a, int64_t queries) {
    if constexpr (kReadsBf16InPlace)
      return a.kv_dtype == DType::bf16 && queries <= V::Half::kWidth && a.k_dim % kLanes == 0 &&
             a.v_dim % kLanes == 0;
    return false;
  }

  // qk_half's scores from bf16 K rows (ld elements apart): a 32-bit broadcast holds k[d] in its high half
  // once shifted and k[d + 1] in its high half once masked. Rows at or past count are masked by the caller
  // whatever their scores, so they reuse row 0.
  template <class W = V>
  [[gnu::noinline]] static void qk_bf16(const float* qt, int64_t mp, const uint16_t* k, int64_t ld,
                                        int64_t count, int dk, float scale, float* s) {
    using H = typename W::Half;
    constexpr int kRows = 8;
    static_assert(kAttentionChunk % kRows == 0);
    for (int p0 = 0; p0 < kAttentionChunk; p0 += kRows) {
      typename H::T acc[kRows];
      for (auto& x : acc) x = H::zero();
      const uint16_t* row[kRows];
      for (int p = 0; p < kRows; ++p) row[p] = k + (p0 + p < count ? p0 + p : 0) * ld;
      for (int d = 0; d < dk; d += 2) {
        const typename H::T q0 = H::load(qt + d * mp), q1 = H::load(qt + (d + 1) * mp);
        for (int p = 0; p < kRows; ++p) {
          const typename H::T pair = H::broadcast_pair(row[p] + d);
          acc[p] = H::fma(H::low_bf16(pair), q0, acc[p]);
          acc[p] = H::fma(H::high_bf16(pair), q1, acc[p]);
        }
      }
      for (int p = 0; p < kRows; ++p) H::store(s + (p0 + p) * mp, H::mul(acc[p], H::set1(scale)));
    }
  }

  static void pv_bf16(const float* s, int64_t mp, int64_t n, const uint16_t* v, int64_t ld, int64_t count,
                      int64_t dvp, float* o) {
    pv_from(s, mp, n, Bf16Rows{v, ld, count}, dvp, o);
  }
};

}  // namespace
}  // namespace xmoe::kernels::attention_detail
