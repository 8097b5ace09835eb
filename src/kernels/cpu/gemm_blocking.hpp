// GotoBLAS/BLIS-style blocking and packing shared by the GEMM variants; each variant supplies only its
// register-blocked microkernel. Plain C++ (no intrinsics), compiled with the including file's ISA flags.
//
// Determinism: every C element is one FMA chain in ascending k order (for VDPBF16PS, a chain over k-pairs
// (2s, 2s+1)). The first kc block starts from zero (or
// from C when accumulating), every later block starts from the value the previous block stored in C, and the
// microkernel accumulates its slots in order. Tiling and threading only decide which thread runs a chain and
// where it stops to store, never the order of its operations, so results are bit-identical for any thread
// count and tile edges; zero k-steps appended at the end add exact zeros.
#pragma once
#include <omp.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <type_traits>

#include "kernels/kernels.hpp"
#include "xmoe/error.hpp"

namespace xmoe::kernels {
// Internal linkage: every ISA file instantiates these templates with its own compiler flags, and a shared
// (weak) instantiation would let the linker run, say, the AVX-512 copy on an AVX2-only machine.
namespace {

struct GemmBlocking {
  int64_t mc;  // rows of op(A) packed per block (rounded up to the kernel's mr); sized for L2
  int64_t kc;  // k per block (rounded up to the kernel's kpack); fewer C loads and stores as it grows
  int64_t nc;  // columns of op(B) packed per block (rounded up to the kernel's nr); sized for L3
};

constexpr int64_t round_up(int64_t x, int64_t m) {
  return (x + m - 1) / m * m;
}
constexpr int64_t ceil_div(int64_t x, int64_t m) {
  return (x + m - 1) / m;
}

template <class P, class In>
inline P to_packed(In x) {
  if constexpr (std::is_same_v<P, In>) {
    return x;
  } else {
    static_assert(std::is_same_v<P, float> && std::is_same_v<In, bf16>, "unsupported packing conversion");
    return bf16::to_float(x.bits);
  }
}

template <class P>
inline P packed_zero() {
  return P{};
}

// Transposes `count` (≤ R) rows of `depth` values, `ld` apart, into one [slot][row][q] micro-panel. It walks
// 64-byte stretches of each row in turn: rows `ld` apart often share L1 sets, so a row-at-a-time slot order
// would miss on nearly every read, while whole stretches use each fetched line once and the 16-slot output
// block stays in L1.
template <int R, int KP, class P, class In>
void pack_rows(const In* src, int64_t ld, int64_t count, int64_t depth, P* panel) {
  constexpr int64_t kBlock = 64 / sizeof(In) / KP;  // slots per 64-byte stretch of a source row
  const int64_t whole = depth / KP;
  for (int64_t s0 = 0; s0 < whole; s0 += kBlock) {
    const int64_t s1 = std::min(whole, s0 + kBlock);
    for (int64_t i = 0; i < count; ++i) {
      const In* row = src + i * ld;
      __builtin_prefetch(row + (s1 + kBlock) * KP);  // a stride the hardware prefetcher does not follow
      for (int64_t s = s0; s < s1; ++s) {
#pragma GCC unroll 2
        for (int q = 0; q < KP; ++q) panel[s * R * KP + i * KP + q] = to_packed<P>(row[s * KP + q]);
      }
    }
  }
  for (int64_t p = whole * KP; p < depth; ++p)
    for (int64_t i = 0; i < count; ++i)
      panel[(p / KP) * R * KP + i * KP + p % KP] = to_packed<P>(src[i * ld + p]);
}

constexpr int64_t kRowsAhead = 8;  // source rows prefetched ahead when a panel takes a short stretch of each

// Packs op(A)[i0 : i0+rows, p0 : p0+depth] into micro-panels of MR rows: panel r holds, for each k-slot s,
// the MR × KP values op(A)[i0 + r·MR + i, p0 + s·KP + q] at [s][i][q]. Rows past `rows` and k past `depth`
// are zero so that edge tiles run the same full-size kernel.
template <int MR, int KP, class P, class In>
void pack_a(const In* a, int64_t lda, bool trans, int64_t i0, int64_t rows, int64_t p0, int64_t depth,
            P* dst) {
  const int64_t slots = ceil_div(depth, KP);
  for (int64_t r0 = 0; r0 < rows; r0 += MR) {
    P* panel = dst + r0 * slots * KP;
    const int64_t mr = std::min<int64_t>(MR, rows - r0);
    if (mr < MR || slots * KP != depth) std::fill(panel, panel + MR * slots * KP, packed_zero<P>());
    if (!trans) {
      pack_rows<MR, KP>(a + (i0 + r0) * lda + p0, lda, mr, depth, panel);
    } else {
      for (int64_t p = 0; p < depth; ++p) {
        const In* src = a + (p0 + p) * lda + i0 + r0;
        if (p + kRowsAhead < depth) {
          __builtin_prefetch(src + kRowsAhead * lda);
          __builtin_prefetch(src + kRowsAhead * lda + mr - 1);
        }
        P* out = panel + (p / KP) * MR * KP + p % KP;
        for (int64_t i = 0; i < mr; ++i) out[i * KP] = to_packed<P>(src[i]);
      }
    }
  }
}

// Packs op(B)[p0 : p0+depth, j0 : j0+cols] into micro-panels of NR columns: panel c holds, for each k-slot s,
// op(B)[p0 + s·KP + q, j0 + c·NR + j] at [s][j][q] (the pair layout VDPBF16PS reads when KP = 2).
template <int NR, int KP, class P, class In>
void pack_b(const In* b, int64_t ldb, bool trans, int64_t p0, int64_t depth, int64_t j0, int64_t cols,
            P* dst) {
  const int64_t slots = ceil_div(depth, KP);
  for (int64_t c0 = 0; c0 < cols; c0 += NR) {
    P* panel = dst + c0 * slots * KP;
    const int64_t nr = std::min<int64_t>(NR, cols - c0);
    if (nr < NR || slots * KP != depth) std::fill(panel, panel + NR * slots * KP, packed_zero<P>());
    if (!trans) {
      for (int64_t p = 0; p < depth; ++p) {
        const In* src = b + (p0 + p) * ldb + j0 + c0;
        // Each row contributes one short stretch per panel, rows ldb apart: without this the copy waits on
        // memory latency for every row.
        if (p + kRowsAhead < depth) {
          __builtin_prefetch(src + kRowsAhead * ldb);
          __builtin_prefetch(src + kRowsAhead * ldb + nr - 1);
        }
        P* out = panel + (p / KP) * NR * KP + p % KP;
        if (KP == 1 && nr == NR) {
#pragma GCC ivdep
          for (int64_t j = 0; j < NR; ++j) out[j] = to_packed<P>(src[j]);
        } else {
          for (int64_t j = 0; j < nr; ++j) out[j * KP] = to_packed<P>(src[j]);
        }
      }
    } else {
      pack_rows<NR, KP>(b + (j0 + c0) * ldb + p0, ldb, nr, depth, panel);
    }
  }
}

template <class In, class Out>
void check_gemm_args(const GemmArgs<In, Out>& g) {
  XMOE_CHECK(g.m >= 0 && g.n >= 0 && g.k >= 0, "gemm: negative size m=", g.m, " n=", g.n, " k=", g.k);
  if (g.m == 0 || g.n == 0) return;
  XMOE_CHECK(g.c != nullptr && g.ldc >= g.n, "gemm: c is null or ldc=", g.ldc, " < n=", g.n);
  if (g.k == 0) return;
  XMOE_CHECK(g.a != nullptr && g.b != nullptr, "gemm: a or b is null");
  XMOE_CHECK(g.lda >= (g.trans_a ? g.m : g.k), "gemm: lda=", g.lda, " too small (trans_a=", g.trans_a, ")");
  XMOE_CHECK(g.ldb >= (g.trans_b ? g.k : g.n), "gemm: ldb=", g.ldb, " too small (trans_b=", g.trans_b, ")");
}

// Handles the cases with nothing to multiply; returns true when the call is complete.
template <class In, class Out>
bool gemm_trivial(const GemmArgs<In, Out>& g) {
  check_gemm_args(g);
  if (g.m == 0 || g.n == 0) return true;
  if (g.k > 0) return false;
  if (!g.accumulate)
    for (int64_t i = 0; i < g.m; ++i) std::fill(g.c + i * g.ldc, g.c + i * g.ldc + g.n, Out{});
  return true;
}

// The rectangle of C one thread owns: whole tiles, split over an tm × tn grid.
struct ThreadRange {
  int64_t m0 = 0, m1 = 0, n0 = 0, n1 = 0;
};

// Picks the tm × tn grid for `threads` threads that minimises the slowest thread's modelled time (its
// multiply plus its packing: each thread packs all the op(B) columns it owns, and its op(A) rows once per nc
// block).
inline void choose_grid(int64_t m, int64_t n, int64_t k, int mr, int nr, int64_t nc, int flops_per_pack,
                        int threads, int& tm, int& tn) {
  const int64_t mt = ceil_div(m, mr), nt = ceil_div(n, nr);
  double best = -1;
  tm = tn = 1;
  for (int a = 1; a <= threads; ++a) {
    if (threads % a != 0) continue;
    const int b = threads / a;
    if (a > mt || b > nt) continue;
    const double rows = static_cast<double>(ceil_div(mt, a) * mr),
                 cols = static_cast<double>(ceil_div(nt, b) * nr);
    const double pack = cols * k + rows * k * static_cast<double>(ceil_div(static_cast<int64_t>(cols), nc));
    const double cost = rows * cols * k / flops_per_pack + pack;
    if (best < 0 || cost < best) best = cost, tm = a, tn = b;
  }
}

inline ThreadRange thread_range(int64_t m, int64_t n, int mr, int nr, int tm, int tn, int tid) {
  const int64_t mt = ceil_div(m, mr), nt = ceil_div(n, nr);
  const int64_t ti = tid / tn, tj = tid % tn;
  ThreadRange r;
  r.m0 = std::min(m, mt * ti / tm * mr);
  r.m1 = std::min(m, mt * (ti + 1) / tm * mr);
  r.n0 = std::min(n, nt * tj / tn * nr);
  r.n1 = std::min(n, nt * (tj + 1) / tn * nr);
  return r;
}

struct AlignedFree {
  void operator()(void* p) const { ::operator delete[](p, std::align_val_t{64}); }
};

// Kernel requirements: static constexpr int mr, nr, kpack; using Packed; and
//   static void run(int64_t slots, const Packed* a_panel, const Packed* b_panel, float* c, int64_t ldc,
//                   int64_t rows, int64_t cols, bool load_c);
// computing the full mr × nr tile over `slots` k-slots (starting from C where load_c, else zero) and storing
// its first rows × cols elements. `flops_per_pack` weighs one packed element against multiply-adds in the
// grid choice (roughly the kernel's multiply-adds per cycle).
template <class K, class In>
void gemm_blocked(const GemmArgs<In, float>& g, GemmBlocking blk, int flops_per_pack) {
  if (gemm_trivial(g)) return;
  using P = typename K::Packed;
  constexpr int MR = K::mr, NR = K::nr, KP = K::kpack;
  const int64_t m = g.m, n = g.n, k = g.k;

  // Whole micro-panels per block: the packing writes full mr / nr panels and pairs of k.
  const int64_t kc = std::min(round_up(blk.kc, KP), round_up(k, KP));
  const int64_t mc = std::min(round_up(blk.mc, MR), round_up(m, MR));
  const int64_t nc = std::min(round_up(blk.nc, NR), round_up(n, NR));
  const int64_t a_elems = round_up(mc * kc, 64), b_elems = round_up(kc * nc, 64);
  const int64_t per_thread = a_elems + b_elems;

  // Tiny products cannot pay for waking a team; the partition never changes results.
  const double macs = static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  const int threads = static_cast<int>(std::clamp(macs / (1 << 18) + 1, 1.0, double(omp_get_max_threads())));
  std::unique_ptr<P[], AlignedFree> buffer(static_cast<P*>(
      ::operator new[](static_cast<size_t>(per_thread * threads) * sizeof(P), std::align_val_t{64})));

#pragma omp parallel num_threads(threads)
  {
    const int team = omp_get_num_threads(), tid = omp_get_thread_num();
    int tm = 1, tn = 1;
    choose_grid(m, n, k, MR, NR, nc, flops_per_pack, team, tm, tn);
    if (tid < tm * tn) {
      const ThreadRange r = thread_range(m, n, MR, NR, tm, tn, tid);
      P* ap = buffer.get() + static_cast<int64_t>(tid) * per_thread;
      P* bp = ap + a_elems;
      for (int64_t jc = r.n0; jc < r.n1; jc += nc) {
        const int64_t nb = std::min(nc, r.n1 - jc);
        for (int64_t pc = 0; pc < k; pc += kc) {
          const int64_t kb = std::min(kc, k - pc), slots = ceil_div(kb, KP);
          const bool load_c = g.accumulate || pc > 0;
          pack_b<NR, KP>(g.b, g.ldb, g.trans_b, pc, kb, jc, nb, bp);
          for (int64_t ic = r.m0; ic < r.m1; ic += mc) {
            const int64_t mb = std::min(mc, r.m1 - ic);
            pack_a<MR, KP>(g.a, g.lda, g.trans_a, ic, mb, pc, kb, ap);
            for (int64_t jr = 0; jr < nb; jr += NR) {
              const P* bpanel = bp + jr * slots * KP;
              for (int64_t ir = 0; ir < mb; ir += MR) {
                // C tiles lie rows apart (often a multiple of 4 KiB, so they conflict in L1); fetching the
                // next tile while this one multiplies hides that latency from the kernel's C loads.
                const int64_t next = ir + MR < mb ? ir + MR : 0;
                const int64_t next_j = ir + MR < mb ? jr : jr + NR;
                if (load_c && next_j < nb) {
                  const int64_t rows = std::min<int64_t>(MR, mb - next);
                  for (int64_t i = 0; i < rows; ++i) {
                    const float* row = g.c + (ic + next + i) * g.ldc + jc + next_j;
                    for (int64_t j = 0; j < std::min<int64_t>(NR, nb - next_j); j += 16)
                      __builtin_prefetch(row + j, 1, 3);
                  }
                }
                K::run(slots, ap + ir * slots * KP, bpanel, g.c + (ic + ir) * g.ldc + jc + jr, g.ldc,
                       std::min<int64_t>(MR, mb - ir), std::min<int64_t>(NR, nb - jr), load_c);
              }
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace xmoe::kernels
