// AMX BF16 GEMM: TDPBF16PS on 16 × 16 f32 accumulator tiles, 2 × 2 of them against 2 op(A) and 2 op(B)
// tiles per 32-k step. Each C element takes linear_bf16tile.hpp's arithmetic (per 32-k step an even and an
// odd f32 sum from +0, added to the running C value), k in ascending steps; k is cut into blocks of kKc
// (a multiple of 32) with C stored and reloaded between them, which is exact, so the bits depend only on k's
// index: not on m, n, the blocks or the thread count. Appended zero k-steps add +0.
//
// Packing: op(A) rows into A tiles ([16 rows][32 k] bf16, zero-padded), op(B) columns into B tiles ([16
// k-pairs][16 columns] of bf16 pairs); whichever operand has k along its rows in memory is interleaved or
// scattered into place with AVX-512. A team splits C's columns into 32-column ranges; each thread packs
// its op(B) columns once per k block and op(A) in row blocks of kMc.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/amx_tiles.hpp"
#include "kernels/cpu/gemm_blocking.hpp"
#include "kernels/cpu/variants.hpp"
#include "kernels/linear.hpp"
#include "util/buffer.hpp"
#include "xmoe/error.hpp"

namespace xmoe::kernels::amx {
namespace {

constexpr int64_t kT = 16;       // tile side
constexpr int64_t kKc = 512;     // k per block: 16 steps
constexpr int64_t kMc = 64;      // op(A) rows per packed block (4 tiles: 64 KiB at kKc)
constexpr int64_t kATile = 512;  // bf16 per A tile
constexpr int64_t kBTile = 256;  // 32-bit pairs per B tile

inline __mmask32 low_mask32(int64_t n) {
  return n >= 32 ? __mmask32(0xffffffffu) : n <= 0 ? __mmask32(0) : __mmask32((1u << n) - 1);
}
// Words 2c and 2c + 1 of the result: element c of lo and of hi (c < 16).
inline __m512i interleave16(__m512i lo, __m512i hi) {
  const __m512i idx = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7,
                                       38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  return _mm512_permutex2var_epi16(lo, idx, hi);
}
// Rows q and q + 1 (ld apart; q + 1 a zero row at depth) of a matrix stored with k down its rows, `mask`
// columns of each, interleaved into 16 bf16 pairs: the B tiles' word order, one per column.
inline __m512i row_pairs(const uint16_t* row_q, int64_t ld, int64_t q, int64_t depth, __mmask32 mask) {
  const __m512i lo = _mm512_maskz_loadu_epi16(mask, row_q);
  const __m512i hi = q + 1 < depth ? _mm512_maskz_loadu_epi16(mask, row_q + ld) : _mm512_setzero_si512();
  return interleave16(lo, hi);
}
inline __m512i dword_index(int64_t stride) {  // c · stride for c = 0..15
  return _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                            _mm512_set1_epi32(static_cast<int32_t>(stride)));
}

// op(A) rows [i0, i0 + rows) × k [p0, p0 + depth) into ceil(rows / 16) A tiles of `steps` steps each:
// tile t, step s at out + (t · steps + s) · 512; zeros past rows and depth.
void pack_a(const GemmArgs<bf16, float>& g, int64_t i0, int64_t rows, int64_t p0, int64_t depth,
            int64_t steps, uint16_t* out) {
  const int64_t tiles = (rows + kT - 1) / kT;
  std::memset(out, 0, static_cast<size_t>(tiles * steps * kATile) * 2);
  const uint16_t* a = reinterpret_cast<const uint16_t*>(g.a);
  if (!g.trans_a) {  // row i's k run along memory: copy 32 at a time
    for (int64_t r = 0; r < rows; ++r) {
      const uint16_t* src = a + (i0 + r) * g.lda + p0;
      uint16_t* dst = out + (r / kT) * steps * kATile + (r % kT) * 32;
      for (int64_t s = 0; s < steps; ++s)
        _mm512_storeu_si512(dst + s * kATile,
                            _mm512_maskz_loadu_epi16(low_mask32(depth - 32 * s), src + 32 * s));
    }
    return;
  }
  // A is stored [k, m]: rows 2p and 2p + 1 of a step give 16 rows' pairs p, interleaved, then scattered to
  // their rows (64 bytes apart).
  const __m512i rows_apart = dword_index(16);
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t h = std::min(kT, rows - t * kT);
    const __mmask32 mask = low_mask32(h);
    for (int64_t s = 0; s < steps; ++s)
      for (int64_t p = 0; p < 16; ++p) {
        const int64_t q = 32 * s + 2 * p;
        if (q >= depth) break;
        const __m512i pairs = row_pairs(a + (p0 + q) * g.lda + i0 + t * kT, g.lda, q, depth, mask);
        _mm512_mask_i32scatter_epi32(out + (t * steps + s) * kATile + 2 * p,
                                     static_cast<__mmask16>((1u << h) - 1), rows_apart, pairs, 4);
      }
  }
}

// op(B) columns [j0, j0 + cols) × k [p0, p0 + depth) into ceil(cols / 16) B tiles: tile u, step s at
// out + (u · steps + s) · 256 words, word [p][c] = op(B)'s pair (32 s + 2 p, + 1) of column c; zeros past.
void pack_b(const GemmArgs<bf16, float>& g, int64_t j0, int64_t cols, int64_t p0, int64_t depth,
            int64_t steps, uint32_t* out) {
  const int64_t tiles = (cols + kT - 1) / kT;
  std::memset(out, 0, static_cast<size_t>(tiles * steps * kBTile) * 4);
  const uint16_t* b = reinterpret_cast<const uint16_t*>(g.b);
  if (!g.trans_b) {  // B stored [k, n]: rows 2p and 2p + 1 interleaved make tile row p
    for (int64_t u = 0; u < tiles; ++u) {
      const __mmask32 mask = low_mask32(std::min(kT, cols - u * kT));
      for (int64_t s = 0; s < steps; ++s)
        for (int64_t p = 0; p < 16; ++p) {
          const int64_t q = 32 * s + 2 * p;
          if (q >= depth) break;
          _mm512_storeu_si512(out + (u * steps + s) * kBTile + p * 16,
                              row_pairs(b + (p0 + q) * g.ldb + j0 + u * kT, g.ldb, q, depth, mask));
        }
    }
    return;
  }
  // B stored [n, k] (op(B) = Bᵀ): column c's 16 pairs of a step are 32 bf16 in a row, scattered down the
  // tile's column.
  const __m512i pairs_apart = dword_index(16);
  for (int64_t c = 0; c < cols; ++c) {
    const uint16_t* src = b + (j0 + c) * g.ldb + p0;
    uint32_t* dst = out + (c / kT) * steps * kBTile + c % kT;
    for (int64_t s = 0; s < steps; ++s) {
      const __m512i v = _mm512_maskz_loadu_epi16(low_mask32(depth - 32 * s), src + 32 * s);
      _mm512_i32scatter_epi32(dst + s * kBTile, pairs_apart, v, 4);
    }
  }
}

// MA × NB accumulator tiles: C(i, j) at c[i · NB + j] with rows cs[i · NB + j] bytes apart, loaded first
// (or zeroed), then every step of the MA op(A) tiles at ap and NB op(B) tiles at bp, then stored.
template <int MA, int NB>
void tiles(const uint16_t* ap, const uint32_t* bp, int64_t steps, float* const* c, const int64_t* cs,
           bool load_c) {
  constexpr int kA = MA * NB, kB = MA * NB + MA;
  if (load_c) {
    load<0>(c[0], cs[0]);
    if constexpr (MA * NB >= 2) load<1>(c[1], cs[1]);
    if constexpr (MA * NB >= 3) load<2>(c[2], cs[2]);
    if constexpr (MA * NB >= 4) load<3>(c[3], cs[3]);
  } else {
    zero<0>();
    if constexpr (MA * NB >= 2) zero<1>();
    if constexpr (MA * NB >= 3) zero<2>();
    if constexpr (MA * NB >= 4) zero<3>();
  }
  for (int64_t s = 0; s < steps; ++s) {
    load<kA>(ap + s * kATile, 64);
    if constexpr (MA == 2) load<kA + 1>(ap + (steps + s) * kATile, 64);
    load<kB>(bp + s * kBTile, 64);
    if constexpr (NB == 2) load<kB + 1>(bp + (steps + s) * kBTile, 64);
    dpbf16<0, kA, kB>();
    if constexpr (NB == 2) dpbf16<1, kA, kB + 1>();
    if constexpr (MA == 2) dpbf16<NB, kA + 1, kB>();
    if constexpr (MA == 2 && NB == 2) dpbf16<3, kA + 1, kB + 1>();
  }
  store<0>(c[0], cs[0]);
  if constexpr (MA * NB >= 2) store<1>(c[1], cs[1]);
  if constexpr (MA * NB >= 3) store<2>(c[2], cs[2]);
  if constexpr (MA * NB >= 4) store<3>(c[3], cs[3]);
}

// One thread's columns [n0, n1) of C for all rows.
void gemm_columns(const GemmArgs<bf16, float>& g, int64_t n0, int64_t n1) {
  const int64_t cols = n1 - n0, col_tiles = (cols + kT - 1) / kT;
  const int64_t max_steps = (std::min(g.k, kKc) + 31) / 32;
  Buffer<uint32_t> bp;
  Buffer<uint16_t> ap;
  bp.ensure(static_cast<size_t>(col_tiles * max_steps * kBTile));
  ap.ensure(static_cast<size_t>(kMc / kT * max_steps * kATile));
  alignas(64) float edge[4][kT * kT];  // edge tiles of C, copied in and out
  load_config(full_tiles());
  for (int64_t p0 = 0; p0 < g.k; p0 += kKc) {
    const int64_t depth = std::min(kKc, g.k - p0), steps = (depth + 31) / 32;
    const bool load_c = p0 > 0 || g.accumulate;
    pack_b(g, n0, cols, p0, depth, steps, bp.data());
    for (int64_t i0 = 0; i0 < g.m; i0 += kMc) {
      const int64_t rows = std::min(kMc, g.m - i0), row_tiles = (rows + kT - 1) / kT;
      pack_a(g, i0, rows, p0, depth, steps, ap.data());
      for (int64_t u = 0; u < col_tiles; u += 2)
        for (int64_t t = 0; t < row_tiles; t += 2) {
          const int ma = t + 1 < row_tiles ? 2 : 1, nb = u + 1 < col_tiles ? 2 : 1;
          float* c[4];
          int64_t cs[4];
          int64_t h[4], w[4];
          for (int i = 0; i < ma; ++i)
            for (int j = 0; j < nb; ++j) {
              const int e = i * nb + j;
              const int64_t r = i0 + (t + i) * kT, col = n0 + (u + j) * kT;
              h[e] = std::min(kT, g.m - r);
              w[e] = std::min(kT, n1 - col);
              float* at = g.c + r * g.ldc + col;
              if (h[e] == kT && w[e] == kT) {
                c[e] = at, cs[e] = g.ldc * 4;
                continue;
              }
              c[e] = edge[e], cs[e] = kT * 4;
              std::memset(edge[e], 0, sizeof(edge[e]));
              if (load_c)
                for (int64_t y = 0; y < h[e]; ++y) std::memcpy(edge[e] + y * kT, at + y * g.ldc, w[e] * 4);
            }
          const uint16_t* a_t = ap.data() + t * steps * kATile;
          const uint32_t* b_u = bp.data() + u * steps * kBTile;
          if (ma == 2 && nb == 2)
            tiles<2, 2>(a_t, b_u, steps, c, cs, load_c);
          else if (ma == 2)
            tiles<2, 1>(a_t, b_u, steps, c, cs, load_c);
          else if (nb == 2)
            tiles<1, 2>(a_t, b_u, steps, c, cs, load_c);
          else
            tiles<1, 1>(a_t, b_u, steps, c, cs, load_c);
          for (int e = 0; e < ma * nb; ++e) {
            if (c[e] != edge[e]) continue;
            const int i = e / nb, j = e % nb;
            float* at = g.c + (i0 + (t + i) * kT) * g.ldc + n0 + (u + j) * kT;
            for (int64_t y = 0; y < h[e]; ++y) std::memcpy(at + y * g.ldc, edge[e] + y * kT, w[e] * 4);
          }
        }
    }
  }
  release();
}

}  // namespace

void gemm_bf16(const GemmArgs<bf16, float>& g) {
  if (gemm_trivial(g)) return;
  // Columns in 32-column ranges over the team (any split gives the same bits).
  const int64_t units = (g.n + 2 * kT - 1) / (2 * kT);
  const int threads = static_cast<int>(std::min<int64_t>(
      units,
      threads_for_macs(static_cast<double>(g.m) * static_cast<double>(g.n) * static_cast<double>(g.k))));
  if (threads <= 1) return gemm_columns(g, 0, g.n);
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), team = omp_get_num_threads();
    const int64_t u0 = units * t / team, u1 = units * (t + 1) / team;
    if (u1 > u0) gemm_columns(g, u0 * 2 * kT, std::min(g.n, u1 * 2 * kT));
  }
}

}  // namespace xmoe::kernels::amx
