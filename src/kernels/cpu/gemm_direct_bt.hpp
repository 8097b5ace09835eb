// GEMM for op(B) = Bᵀ (B stored [n, k], as a weight [out, in] is) with few rows of op(A), computed as its
// transpose Cᵀ = B · op(A)ᵀ: B's rows are the broadcast operand, read where they lie, and op(A)ᵀ is the
// packed vector operand. gemm_blocked packs all of op(B) for such products, transposing a 2048 × 2048 weight
// in 32-bit units for each call, plus op(A) in scalar steps: 7 % of 512 × 2048 × 2048 NT at VDPBF16PS on
// Zen 4 and ~15 % at 64 rows, where oneDNN ran 4–6 % ahead. Here only op(A) (m × k) is packed. Each ISA
// level supplies its tiles and decides the row counts where this pays (gemm_avx512_bf16.cpp, gemm_avx512.cpp,
// gemm_avx2.cpp).
//
// Same bits as gemm_blocked: each C element is still one chain over k-slots in ascending order (k-blocks
// start at even k, an odd k's last slot pairs with zero), and every product takes the same two operands
// (a multiplication commutes exactly), so the results are those of the packed path for any thread count.
// Partial sums between k-blocks live in a per-thread Cᵀ buffer, stored and loaded exactly, and are
// transposed into C once at the end (and out of C at the start when accumulating).
//
// Kernel family requirements (a struct F):
//   static constexpr int rows, width, max_nv, kpack;  // B rows per tile; lanes per vector; vectors of
//                                                     // op(A)ᵀ per tile; k values per slot
//   using Packed;                                     // op(A)ᵀ as pack_b packs nr = width · nv columns
//   template <int NV> static void run(int64_t depth, const In* b, int64_t ldb, int64_t b_rows,
//                                     const Packed* a_panel, float* ct, int64_t ldct, bool load);
// computing ct[i · ldct + l] (+)= Σ_p B[i][p] · a_panel's lane l at p, for l < width · NV, over `depth` k
// values (an odd depth reads only the last slot's first value of each row), for all `rows` rows: rows at or
// past b_rows read row 0 again and their sums are never transposed into C. op(A)'s rows go in panels of width
// · max_nv lanes and one narrower last panel of whole vectors, so less than a vector is wasted.
#pragma once
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <new>
#include <type_traits>

#include "kernels/cpu/gemm_blocking.hpp"

namespace xmoe::kernels {
namespace {

// dst[c · ldd + r] = src[r · lds + c] for r < rows, c < cols: 8 × 8 blocks through registers, the edges one
// value at a time.
inline void transpose_floats(const float* src, int64_t lds, int64_t rows, int64_t cols, float* dst,
                             int64_t ldd) {
  int64_t r0 = 0;
  for (; r0 + 8 <= rows; r0 += 8) {
    int64_t c0 = 0;
    for (; c0 + 8 <= cols; c0 += 8) {
      __m256 r[8];
#pragma GCC unroll 8
      for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + (r0 + i) * lds + c0);
      transpose8(r);
#pragma GCC unroll 8
      for (int i = 0; i < 8; ++i) _mm256_storeu_ps(dst + (c0 + i) * ldd + r0, r[i]);
    }
    for (; c0 < cols; ++c0)
      for (int64_t i = 0; i < 8; ++i) dst[c0 * ldd + r0 + i] = src[(r0 + i) * lds + c0];
  }
  for (; r0 < rows; ++r0)
    for (int64_t c = 0; c < cols; ++c) dst[c * ldd + r0] = src[r0 * lds + c];
}

// A tile's row pointers into B: rows at or past b_rows read row 0 again (their sums are never used).
template <int MR, class In>
inline void tile_rows(const In* b, int64_t ldb, int64_t b_rows, const In* (&row)[MR]) {
#pragma GCC unroll 32
  for (int i = 0; i < MR; ++i) row[i] = b + (i < b_rows ? i : 0) * ldb;
}

// The f32 vector of `width` lanes, for the ISA files that include this.
template <int width>
struct F32Vector;
#ifdef __AVX512F__
template <>
struct F32Vector<16> {
  using type = __m512;
  static type load(const float* p) { return _mm512_load_ps(p); }
  static type zero() { return _mm512_setzero_ps(); }
  static void store(float* p, type v) { _mm512_store_ps(p, v); }
};
#endif
template <>
struct F32Vector<8> {
  using type = __m256;
  static type load(const float* p) { return _mm256_load_ps(p); }
  static type zero() { return _mm256_setzero_ps(); }
  static void store(float* p, type v) { _mm256_store_ps(p, v); }
};

// A tile's Cᵀ sums: loaded from the chunk (or zero on its first k-block), stored back after it.
template <int W, int MR, int NV>
inline void load_tile(typename F32Vector<W>::type (&acc)[MR][NV], const float* ct, int64_t ldct, bool load) {
#pragma GCC unroll 32
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v)
      acc[i][v] = load ? F32Vector<W>::load(ct + i * ldct + W * v) : F32Vector<W>::zero();
  }
}
template <int W, int MR, int NV>
inline void store_tile(const typename F32Vector<W>::type (&acc)[MR][NV], float* ct, int64_t ldct) {
#pragma GCC unroll 32
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) F32Vector<W>::store(ct + i * ldct + W * v, acc[i][v]);
  }
}

// Calls f(std::integral_constant<int, nv>) for the runtime nv in [1, Max].
template <int Max, class Fn>
void with_nv(int64_t nv, Fn&& f) {
  if constexpr (Max > 1) {
    if (nv < Max) return with_nv<Max - 1>(nv, f);
  }
  f(std::integral_constant<int, Max>{});
}

// The products gemm_bt_direct serves: op(B) = Bᵀ with 32 to max_rows rows (each ISA level's measured end of
// the gain) whose vectors of F::width lanes waste at most 8 % (100 rows in 64 + 48 lanes ran 3–6 % behind the
// packed path at VDPBF16PS), and k at least 3 rows: what it saves, packing B, costs per C element about k / m
// packed values, and what it adds, the transpose of Cᵀ, about one value (at VDPBF16PS on Zen 4 300 and 512
// rows with k = 768 ran 4 % behind the packed path, 512 rows with k = 2048 4 % ahead).
template <class F, class In>
bool direct_bt_applies(const GemmArgs<In, float>& g, int64_t max_rows) {
  return g.trans_b && g.m >= 32 && g.m <= max_rows && round_up(g.m, F::width) * 25 <= g.m * 27 &&
         g.k >= 3 * g.m && g.n > 0;
}

// Sizes swept at VDPBF16PS on Zen 4 (two threads, against oneDNN in the same run): op(A)ᵀ blocks of 512 KiB
// and Cᵀ chunks of 192 B rows 1–3 % ahead of 256 KiB and of 64 rows.
constexpr int64_t kDirectBlockBytes = 512 << 10, kDirectChunkRows = 192;

// The team packs all of op(A)ᵀ once (each thread a share of each k-block's panels; one barrier), then each
// thread takes its B rows a chunk at a time: all k-blocks of the chunk against the block of op(A)ᵀ that
// kDirectBlockBytes keeps in L2, its Cᵀ (chunk_rows × m) small enough to stay beside it, transposed into C
// while still cached.
template <class F, class In>
void gemm_bt_direct(const GemmArgs<In, float>& g) {
  constexpr int64_t a_block_bytes = kDirectBlockBytes, chunk_rows = kDirectChunkRows;
  if (gemm_trivial(g)) return;
  using P = typename F::Packed;
  constexpr int64_t KP = F::kpack, R = F::rows, W = F::width, L = W * F::max_nv;
  const int64_t m = g.m, n = g.n, k = g.k;
  const int64_t m_pad = round_up(m, W), panels = ceil_div(m, L), last_nv = (m_pad - (panels - 1) * L) / W;
  // k-blocks start at multiples of kc, an even number, as the packed path's kc blocks do.
  const int64_t kc = std::min(
      round_up(std::max<int64_t>(a_block_bytes / (m_pad * static_cast<int64_t>(sizeof(P))), 256), 64),
      round_up(k, KP));
  const int64_t blocks = ceil_div(k, kc), block_elems = m_pad * kc;
  const int64_t chunk = round_up(chunk_rows, R);

  const double macs = static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  const int64_t groups = ceil_div(n, R);
  const int threads = static_cast<int>(
      std::min<double>(std::clamp(macs / (1 << 18) + 1, 1.0, double(omp_get_max_threads())), groups));
  const int64_t a_bytes = round_up(blocks * block_elems * static_cast<int64_t>(sizeof(P)), 64),
                ct_bytes = round_up(chunk * m_pad * 4, 64);
  std::unique_ptr<char[], AlignedFree> buffer(static_cast<char*>(
      ::operator new[](static_cast<size_t>(a_bytes + ct_bytes * threads), std::align_val_t{64})));
  P* const ap = reinterpret_cast<P*>(buffer.get());

#pragma omp parallel num_threads(threads)
  {
    const int team = omp_get_num_threads(), tid = omp_get_thread_num();
    // op(A)ᵀ[pc : pc + kb, 0 : m] for every k-block, lanes = op(A)'s rows (A stored [m, k] is that block
    // transposed); the team's share of the blocks' panels.
    for (int64_t blk = tid; blk < blocks * panels; blk += team) {
      const int64_t b = blk / panels, p = blk % panels, pc = b * kc, kb = std::min(kc, k - pc);
      with_nv<F::max_nv>(p + 1 < panels ? F::max_nv : last_nv, [&](auto nv) {
        pack_b<W * nv(), KP>(g.a, g.lda, !g.trans_a, pc, kb, p * L, std::min(L, m - p * L),
                             ap + b * block_elems + p * L * ceil_div(kb, KP) * KP);
      });
    }
#pragma omp barrier
    const int64_t n0 = std::min(n, groups * tid / team * R), n1 = std::min(n, groups * (tid + 1) / team * R);
    float* ct = reinterpret_cast<float*>(buffer.get() + a_bytes + ct_bytes * tid);
    for (int64_t c0 = n0; c0 < n1; c0 += chunk) {
      const int64_t c1 = std::min(n1, c0 + chunk);
      if (g.accumulate) transpose_floats(g.c + c0, g.ldc, m, c1 - c0, ct, m_pad);
      for (int64_t b = 0; b < blocks; ++b) {
        const int64_t pc = b * kc, kb = std::min(kc, k - pc), slots = ceil_div(kb, KP);
        const bool load = g.accumulate || pc > 0;
        for (int64_t jr = c0; jr < c1; jr += R) {
          const In* brows = g.b + jr * g.ldb + pc;
          const int64_t b_rows = std::min(R, c1 - jr);
          float* out = ct + (jr - c0) * m_pad;
          const P* a_block = ap + b * block_elems;
          for (int64_t p = 0; p + 1 < panels; ++p)
            F::template run<F::max_nv>(kb, brows, g.ldb, b_rows, a_block + p * L * slots * KP, out + p * L,
                                       m_pad, load);
          with_nv<F::max_nv>(last_nv, [&](auto nv) {
            F::template run<nv()>(kb, brows, g.ldb, b_rows, a_block + (panels - 1) * L * slots * KP,
                                  out + (panels - 1) * L, m_pad, load);
          });
        }
      }
      transpose_floats(ct, m_pad, c1 - c0, m, g.c + c0, g.ldc);
    }
  }
}

}  // namespace
}  // namespace xmoe::kernels
