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
#ifdef __AVX2__
#include "kernels/cpu/gemm_pack_avx2.hpp"
#endif

namespace xmoe::kernels {
// Internal linkage: every ISA file instantiates these templates with its own compiler flags, and a shared
// (weak) instantiation would let the linker run, say, the AVX-512 copy on an AVX2-only machine.
namespace {

struct GemmBlocking {
  int64_t mc;  // rows of op(A) packed per block (rounded up to the kernel's mr); sized for L2
  int64_t kc;  // k per block (rounded up to the kernel's kpack); fewer C loads and stores as it grows
  int64_t nc;  // columns of op(B) packed per block (rounded up to the kernel's nr); sized for L3
  // The few-rows path: when a thread has at most mc_once rows (at least mc), they are packed as one op(A)
  // block kc_once deep, and op(B) is packed nc_small columns at a time (kc_once × nc_small sized to stay in
  // L2 next to it).
  int64_t mc_once, kc_once, nc_small;
  // The same for an op(B) = Bᵀ (k along B's rows, as for a weight stored [out, in]): the next block's
  // source rows, prefetched into L2 while a block multiplies, are `ldb` apart, often a multiple of 4 KiB, so
  // a short stretch of each row lands in a fraction of L2's sets; longer, fewer rows spread it. 0: as above.
  int64_t kc_once_tb = 0, nc_small_tb = 0;
  // A team splits a product of at most split_rows rows over columns, each thread all rows on the few-rows
  // path, instead of sharing op(B) blocks on the tall one.
  int64_t split_rows = 0;
  // The tile order within a packed block. false: each op(B) micro-panel (kc × nr) against all of the
  // block's op(A) micro-panels, which stream past it. true: each op(A) micro-panel (mr × kc, small enough to
  // stay in L1) against all of the op(B) block's, which stream from L2, as GotoBLAS's inner kernel does (at
  // AVX2 it measured ahead on the tall path too, whose 512 × 2048 op(B) blocks exceed L2).
  bool rows_outer = false;
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
  int64_t done = 0;  // slots the vector transpose packed
#ifdef __AVX2__
  if constexpr (kPackRowsAvx2<R, KP, P, In>) {
    if (count == R) {
      done = whole / 8 * 8;
      pack_rows_avx2<R, KP>(src, ld, R / 8, done, panel);
    }
  }
#endif
  for (int64_t s0 = done; s0 < whole; s0 += kBlock) {
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

constexpr int64_t kRowsAhead = 8;  // source rows prefetched ahead of a strided walk

// Packs `count` values along each of `depth` source rows (`ld` apart; k runs down the rows, the panels' rows
// or columns along each) into consecutive micro-panels of R, laid out as pack_rows lays them out. One pass
// over each source row with contiguous reads, however many panels: a panel-at-a-time walk re-reads every
// row once per panel at a stride the hardware prefetcher does not follow (measured on Zen 4: a B block of
// 512 × 2048 for 168 rows went from ~80 to ~85 GFLOP/s).
template <int R, int KP, class P, class In>
void pack_strided_k(const In* src, int64_t ld, int64_t count, int64_t depth, P* dst) {
  const int64_t slots = ceil_div(depth, KP);
  constexpr int64_t kLine = 64 / static_cast<int64_t>(sizeof(In));
  // KP source rows at a time, interleaved into each panel's k-slot: whole contiguous slots written (for bf16
  // pairs, 2-byte stores one apart would each be a separate store).
  for (int64_t p = 0; p < depth; p += KP) {
    const int64_t q_end = std::min<int64_t>(KP, depth - p);  // a short last slot keeps its zeros
    for (int64_t q = 0; q < q_end; ++q) {
      if (p + q + kRowsAhead < depth)
        for (int64_t j = 0; j < count; j += kLine) __builtin_prefetch(src + (p + q + kRowsAhead) * ld + j);
    }
    P* out = dst + (p / KP) * R * KP;
    int64_t c0 = 0;
    if (q_end == KP) {
      for (; c0 + R <= count; c0 += R, out += slots * R * KP) {
#pragma GCC unroll 8
        for (int64_t i = 0; i < R; ++i) {
#pragma GCC unroll 2
          for (int q = 0; q < KP; ++q) out[i * KP + q] = to_packed<P>(src[(p + q) * ld + c0 + i]);
        }
      }
    }
    for (; c0 < count; c0 += R, out += slots * R * KP) {
      for (int64_t i = 0; i < std::min<int64_t>(R, count - c0); ++i)
        for (int64_t q = 0; q < q_end; ++q) out[i * KP + q] = to_packed<P>(src[(p + q) * ld + c0 + i]);
    }
  }
}

// Zero-fills the micro-panels of R that `count` values × `depth` leave partly empty, so that edge tiles run
// the same full-size kernel and k past `depth` adds exact zeros.
template <int R, int KP, class P>
void zero_partial_panels(int64_t count, int64_t depth, P* dst) {
  const int64_t slots = ceil_div(depth, KP);
  for (int64_t c0 = 0; c0 < count; c0 += R) {
    P* panel = dst + c0 * slots * KP;
    if (count - c0 < R || slots * KP != depth) std::fill(panel, panel + R * slots * KP, packed_zero<P>());
  }
}

// Packs op(A)[i0 : i0+rows, p0 : p0+depth] into micro-panels of MR rows: panel r holds, for each k-slot s,
// the MR × KP values op(A)[i0 + r·MR + i, p0 + s·KP + q] at [s][i][q]. Rows past `rows` and k past `depth`
// are zero.
template <int MR, int KP, class P, class In>
void pack_a(const In* a, int64_t lda, bool trans, int64_t i0, int64_t rows, int64_t p0, int64_t depth,
            P* dst) {
  zero_partial_panels<MR, KP>(rows, depth, dst);
  if (trans) return pack_strided_k<MR, KP>(a + p0 * lda + i0, lda, rows, depth, dst);
  const int64_t slots = ceil_div(depth, KP);
  for (int64_t r0 = 0; r0 < rows; r0 += MR)
    pack_rows<MR, KP>(a + (i0 + r0) * lda + p0, lda, std::min<int64_t>(MR, rows - r0), depth,
                      dst + r0 * slots * KP);
}

// Packs op(B)[p0 : p0+depth, j0 : j0+cols] into micro-panels of NR columns: panel c holds, for each k-slot s,
// op(B)[p0 + s·KP + q, j0 + c·NR + j] at [s][j][q] (the pair layout VDPBF16PS reads when KP = 2).
template <int NR, int KP, class P, class In>
void pack_b(const In* b, int64_t ldb, bool trans, int64_t p0, int64_t depth, int64_t j0, int64_t cols,
            P* dst) {
  zero_partial_panels<NR, KP>(cols, depth, dst);
  if (!trans) return pack_strided_k<NR, KP>(b + p0 * ldb + j0, ldb, cols, depth, dst);
  const int64_t slots = ceil_div(depth, KP);
  for (int64_t c0 = 0; c0 < cols; c0 += NR)
    pack_rows<NR, KP>(b + (j0 + c0) * ldb + p0, ldb, std::min<int64_t>(NR, cols - c0), depth,
                      dst + c0 * slots * KP);
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
// multiply plus its packing: its op(A) rows once per nc block, and the op(B) columns it owns, or with tn = 1,
// where all threads multiply the same op(B) block, its 1/threads share of the block they pack together).
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
    const double b_pack = b == 1 ? cols * k / threads : cols * k;
    const double pack = b_pack + rows * k * static_cast<double>(ceil_div(static_cast<int64_t>(cols), nc));
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

// Fetches the source of the op(B) block packed next into L2 while the current block multiplies, a line
// every other k-slot of the micro-kernel's loop. Packing otherwise waits on L3 or memory for every line it
// reads. Spread thin because a burst between micro-tiles (a few hundred lines) fills the core's miss buffers
// and stalls the kernel's own loads for longer than it saves.
struct SourcePrefetch {
  const char* row = nullptr;  // the current source row
  int64_t ld_bytes = 0, lines_per_row = 0;
  int64_t line = 0;   // next line of the current row, counted from the line holding its first byte
  int64_t left = 0;   // lines not yet fetched, less the current quota
  int64_t quota = 0;  // lines the current micro-tile may fetch

  template <class In>
  SourcePrefetch(const In* src, int64_t ld, int64_t rows, int64_t row_elems)
      : row(reinterpret_cast<const char*>(src)), ld_bytes(ld * static_cast<int64_t>(sizeof(In))) {
    // A row that starts mid-line spans one line more than its length rounds to: the walk covers it, and at
    // worst fetches a line past a row's end (a prefetch never faults).
    lines_per_row = ceil_div(row_elems * static_cast<int64_t>(sizeof(In)) + 63, 64);
    left = rows * lines_per_row;
  }
  SourcePrefetch() = default;

  // The kernels' hook: one line, while the tile's quota lasts. It touches `quota` alone: GCC merged a
  // decrement of `left` next to it into one SSE add, whose xmm register the AVX2 kernel's k loop (15 of 16
  // ymm registers live) paid for by spilling an accumulator.
  void step() {
    if (quota <= 0) return;
    --quota;
    const uintptr_t first = reinterpret_cast<uintptr_t>(row) & ~uintptr_t{63};
    __builtin_prefetch(reinterpret_cast<const void*>(first + static_cast<uintptr_t>(line) * 64), 0, 2);
    if (++line == lines_per_row) line = 0, row += ld_bytes;
  }
  // Hands the next micro-tile its share of the lines not yet fetched, `tiles` tiles to go including it.
  void share(int64_t tiles) {
    left += quota;  // what the tile before left unfetched
    quota = ceil_div(left, tiles);
    left -= quota;
  }
  void finish() {
    quota += left, left = 0;
    while (quota > 0) step();
  }
};

// The source rectangle pack_b reads for op(B)[p0 : p0+depth, j0 : j0+cols].
template <class In>
SourcePrefetch b_source(const In* b, int64_t ldb, bool trans, int64_t p0, int64_t depth, int64_t j0,
                        int64_t cols) {
  return trans ? SourcePrefetch(b + j0 * ldb + p0, ldb, cols, depth)
               : SourcePrefetch(b + p0 * ldb + j0, ldb, depth, cols);
}

// Multiplies one packed block: the op(A) rows [0, mb) packed at `ap` by the op(B) columns [0, nb) packed at
// `bp`, into C at `c` (row ic, column jc of the caller's C). `source`, when given, is fetched over the block.
// `rows_outer` (GemmBlocking) picks the tile order: each op(A) micro-panel against every op(B) micro-panel
// of the block, or each op(B) micro-panel against every op(A) one.
template <class K>
void multiply_block(const typename K::Packed* ap, const typename K::Packed* bp, int64_t slots, int64_t mb,
                    int64_t nb, float* c, int64_t ldc, bool load_c, bool rows_outer,
                    SourcePrefetch* source = nullptr) {
  constexpr int MR = K::mr, NR = K::nr, KP = K::kpack;
  const int64_t tiles = ceil_div(nb, NR) * ceil_div(mb, MR);
  int64_t tile = 0;
  // The tile at (ir, jr), and a prefetch of the one at (next_i, next_j) that runs after it.
  auto run_tile = [&](int64_t ir, int64_t jr, int64_t next_i, int64_t next_j) {
    // C tiles lie rows apart (often a multiple of 4 KiB, so they conflict in L1); fetching the next tile
    // while this one multiplies hides that latency from the kernel's C loads.
    if (load_c && next_i < mb && next_j < nb) {
      const int64_t rows = std::min<int64_t>(MR, mb - next_i);
      for (int64_t i = 0; i < rows; ++i) {
        const float* row = c + (next_i + i) * ldc + next_j;
        for (int64_t j = 0; j < std::min<int64_t>(NR, nb - next_j); j += 16)
          __builtin_prefetch(row + j, 1, 3);
      }
    }
    if (source) source->share(tiles - tile++);
    K::run(slots, ap + ir * slots * KP, bp + jr * slots * KP, c + ir * ldc + jr, ldc,
           std::min<int64_t>(MR, mb - ir), std::min<int64_t>(NR, nb - jr), load_c, source);
  };
  if (rows_outer) {
    for (int64_t ir = 0; ir < mb; ir += MR)
      for (int64_t jr = 0; jr < nb; jr += NR)
        run_tile(ir, jr, jr + NR < nb ? ir : ir + MR, jr + NR < nb ? jr + NR : 0);
  } else {
    for (int64_t jr = 0; jr < nb; jr += NR)
      for (int64_t ir = 0; ir < mb; ir += MR)
        run_tile(ir, jr, ir + MR < mb ? ir + MR : 0, ir + MR < mb ? jr : jr + NR);
  }
  if (source) source->finish();  // what short k blocks left over
}

// Kernel requirements: static constexpr int mr, nr, kpack; using Packed; and
//   static void run(int64_t slots, const Packed* a_panel, const Packed* b_panel, float* c, int64_t ldc,
//                   int64_t rows, int64_t cols, bool load_c, SourcePrefetch* source);
// computing the full mr × nr tile over `slots` k-slots (starting from C where load_c, else zero) and storing
// its first rows × cols elements; where `source` is given, calling source->step() every other k-slot.
// `flops_per_pack` weighs one packed element against multiply-adds in the grid choice (roughly the kernel's
// multiply-adds per cycle).
//
// Threads split C over a tm × tn grid. With tn = 1 (tall products: the experts' forward, dX and the weight
// gradient) every thread multiplies the same op(B) block, so the team packs each block once, each thread a
// share of its micro-panels, into one of two shared buffers: half the packing and half the cache footprint
// of a copy per thread. One barrier per block: a thread packing block i + 1 into the buffer of block i − 1
// has passed block i's barrier, which no thread reaches before it has finished multiplying block i − 1.
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
  // The few-rows path (below): all of a thread's rows in one op(A) block, kc_once deep, and op(B) blocks of
  // nc_small columns.
  const int64_t mc_once = std::min(round_up(std::max(blk.mc_once, blk.mc), MR), round_up(m, MR));
  const bool rows_along_k = g.trans_b && blk.kc_once_tb > 0;
  const int64_t kc_once =
      std::min(round_up(rows_along_k ? blk.kc_once_tb : blk.kc_once, KP), round_up(k, KP));
  const int64_t nc_once =
      std::min(round_up(rows_along_k ? blk.nc_small_tb : blk.nc_small, NR), round_up(n, NR));
  const int64_t a_elems = round_up(std::max(mc * kc, mc_once * kc_once), 64),
                b_elems = round_up(std::max(kc * nc, kc_once * nc_once), 64);

  // Tiny products cannot pay for waking a team; the partition never changes results.
  const double macs = static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  const int threads = static_cast<int>(std::clamp(macs / (1 << 18) + 1, 1.0, double(omp_get_max_threads())));
  // One op(A) buffer per thread, then max(threads, 2) op(B) buffers: one per thread, or the two shared ones.
  const int64_t b_buffers = std::max(threads, 2);
  std::unique_ptr<P[], AlignedFree> buffer(static_cast<P*>(::operator new[](
      static_cast<size_t>(a_elems * threads + b_elems * b_buffers) * sizeof(P), std::align_val_t{64})));

#pragma omp parallel num_threads(threads)
  {
    const int team = omp_get_num_threads(), tid = omp_get_thread_num();
    int tm = 1, tn = 1;
    choose_grid(m, n, k, MR, NR, nc, flops_per_pack, team, tm, tn);
    // Up to split_rows rows the team splits the columns instead, each thread all rows on the few-rows path
    // (the model above has no term for that path's L2-resident blocks and prefetched source).
    if (team > 1 && round_up(m, MR) <= std::min(mc_once, blk.split_rows) && ceil_div(n, NR) >= team)
      tm = 1, tn = team;
    const bool shared_b = team > 1 && tn == 1;  // then tm == team: every thread has rows
    P* ap = buffer.get() + static_cast<int64_t>(tid) * a_elems;
    P* b_base = buffer.get() + a_elems * threads;
    if (tid < tm * tn) {
      const ThreadRange r = thread_range(m, n, MR, NR, tm, tn, tid);
      // When every thread's rows fit one op(A) block of mc_once rows (the experts' mid shapes), op(A) is
      // packed once per k block and op(B) blocks are cut to nc_small columns, so that the block just packed
      // is still in L2 when the kernel reads it; the k blocks then run outermost. The row count each thread
      // can have, not its own, decides. A team sharing op(B) keeps the tall path: the narrow blocks would
      // cost a barrier each (64 for 512 × 2048 × 2048 on two threads, which ran at a fifth of the speed on
      // a loaded machine, where each barrier can wait for a descheduled thread).
      const int64_t rows_max = ceil_div(ceil_div(m, MR), tm) * MR;
      const bool a_once = !shared_b && rows_max <= mc_once;
      // mc blocks of equal size: 512 rows in blocks of 168 left a block of 8 that re-read the whole packed
      // op(B) block for them.
      const int64_t mc_even =
          round_up(ceil_div(r.m1 - r.m0, std::max<int64_t>(1, ceil_div(r.m1 - r.m0, mc))), MR);
      const int64_t ncb = a_once ? nc_once : nc, kcb = a_once ? kc_once : kc,
                    mcb = a_once ? mc_once : std::max<int64_t>(MR, mc_even);
      int64_t block = 0;
      auto step = [&](int64_t jc, int64_t pc, bool pack_a_now, SourcePrefetch* next) {
        const int64_t nb = std::min(ncb, r.n1 - jc);
        const int64_t kb = std::min(kcb, k - pc), slots = ceil_div(kb, KP);
        const bool load_c = g.accumulate || pc > 0;
        P* bp = b_base + (shared_b ? block % 2 : tid) * b_elems;
        ++block;
        if (shared_b) {
          const int64_t panels = ceil_div(nb, NR), p0 = panels * tid / team, p1 = panels * (tid + 1) / team;
          if (p1 > p0)
            pack_b<NR, KP>(g.b, g.ldb, g.trans_b, pc, kb, jc + p0 * NR, std::min(nb, p1 * NR) - p0 * NR,
                           bp + p0 * NR * slots * KP);
#pragma omp barrier
        } else {
          pack_b<NR, KP>(g.b, g.ldb, g.trans_b, pc, kb, jc, nb, bp);
        }
        for (int64_t ic = r.m0; ic < r.m1; ic += mcb) {
          const int64_t mb = std::min(mcb, r.m1 - ic);
          if (pack_a_now) pack_a<MR, KP>(g.a, g.lda, g.trans_a, ic, mb, pc, kb, ap);
          multiply_block<K>(ap, bp, slots, mb, nb, g.c + ic * g.ldc + jc, g.ldc, load_c, blk.rows_outer,
                            next);
        }
      };
      if (a_once) {
        // The narrow op(B) blocks fit L2 next to op(A): each block's source is fetched while the one before
        // it multiplies.
        for (int64_t pc = 0; pc < k; pc += kcb) {
          for (int64_t jc = r.n0; jc < r.n1; jc += ncb) {
            int64_t pn = pc, jn = jc + ncb;
            if (jn >= r.n1) pn += kcb, jn = r.n0;
            SourcePrefetch next;
            if (pn < k)
              next = b_source(g.b, g.ldb, g.trans_b, pn, std::min(kcb, k - pn), jn, std::min(ncb, r.n1 - jn));
            step(jc, pc, jc == r.n0, pn < k ? &next : nullptr);
          }
        }
      } else {
        for (int64_t jc = r.n0; jc < r.n1; jc += nc)
          for (int64_t pc = 0; pc < k; pc += kc) step(jc, pc, true, nullptr);
      }
    }
  }
}

}  // namespace
}  // namespace xmoe::kernels
