// AVX2 linear kernels for f32, bf16 and f16 weights: the 16 lanes of the shared summation order
// (linear_lanes.hpp) as two 8-float registers, so results equal the reference's (and the AVX-512 variant's)
// bit for bit.
#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <type_traits>

#include "kernels/cpu/linear_bf16_pairs_avx2.hpp"
#include "kernels/cpu/linear_panels_avx2.hpp"
#include "kernels/cpu/prefetch_slice.hpp"
#include "kernels/cpu/variants.hpp"
#include "xmoe/error.hpp"

namespace xmoe::kernels::avx2 {
namespace {

struct f16 {  // IEEE binary16 bits (F16C converts them)
  uint16_t bits;
};

inline __m256 load8(const float* p) {
  return _mm256_loadu_ps(p);
}
inline __m256 load8(const bf16* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline __m256 load8(const f16* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// Weight rows start ldw elements apart; each holds k elements. `next` / `next_bytes`: memory to prefetch into
// L2 while this tile runs, spread evenly over its steps (see rows_block for why).
template <int MR, int NR, class W>
void tile(const float* x, int64_t ldx, const W* w, int64_t ldw, int64_t k, float* y, int64_t ldy,
          const char* next = nullptr, int64_t next_bytes = 0) {
  __m256 lo[MR][NR], hi[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) lo[i][j] = hi[i][j] = _mm256_setzero_ps();
  auto step = [&](const float* const* xs, const W* const* ws) {
    for (int j = 0; j < NR; ++j) {
      const __m256 wl = load8(ws[j]), wh = load8(ws[j] + 8);
      for (int i = 0; i < MR; ++i) {
        lo[i][j] = _mm256_fmadd_ps(_mm256_loadu_ps(xs[i]), wl, lo[i][j]);
        hi[i][j] = _mm256_fmadd_ps(_mm256_loadu_ps(xs[i] + 8), wh, hi[i][j]);
      }
    }
  };
  const float* xs[MR];
  const W* ws[NR];
  // Each step reads NR·16 weights; prefetching as many bytes of `next` per step covers a tile of the same
  // shape by the time this one ends.
  constexpr int64_t kStepBytes = NR * 16 * int64_t(sizeof(W));
  int64_t p = 0;
  for (; p + 16 <= k; p += 16) {
    prefetch_slice(next, p / 16 * kStepBytes, kStepBytes, next_bytes);
    for (int i = 0; i < MR; ++i) xs[i] = x + i * ldx + p;
    for (int j = 0; j < NR; ++j) ws[j] = w + j * ldw + p;
    step(xs, ws);
  }
  if (p < k) {  // the tail, zero-padded to a whole step (zero products leave the lanes unchanged)
    float xt[MR][16] = {};
    W wt[NR][16] = {};
    for (int i = 0; i < MR; ++i)
      std::memcpy(xt[i], x + i * ldx + p, static_cast<size_t>(k - p) * sizeof(float));
    for (int j = 0; j < NR; ++j)
      std::memcpy(static_cast<void*>(wt[j]), w + j * ldw + p, static_cast<size_t>(k - p) * sizeof(W));
    for (int i = 0; i < MR; ++i) xs[i] = xt[i];
    for (int j = 0; j < NR; ++j) ws[j] = wt[j];
    step(xs, ws);
  }
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) y[i * ldy + j] = panels::reduce16(lo[i][j], hi[i][j]);
}

// Columns [n0, n1) for MR rows: NR weight rows at a time, then one at a time for the tail.
//
// Decode (m < 4) is bound by how fast the weights stream in, and the hardware prefetchers alone do not keep
// up: they stop at 4 KiB pages, and a tile reads NR rows at once (each a page or less of bf16 at Qwen3
// shapes), so every tile's streams would start cold. Each tile therefore asks for the rows kRowsAhead tiles
// on to come into L2 while it computes, as the AVX-512 kernels do; the first tiles' rows are requested up
// front. bf16, m = 1, one thread's CPU time, weights from DRAM, medians of 8 alternated runs (Zen 4):
// without a software prefetch expert gate+up streamed at 15.1 GB/s, expert down (k = 768) 8.7, attention q
// 14.8; one tile ahead 19.3 / 17.0 / 20.2; two tiles ahead 20.2 / 20.6 / 20.9.
constexpr int64_t kRowsAhead = 2;

template <int MR, int NR, class W>
void rows_block(const float* x, int64_t ldx, const W* w, int64_t ldw, int64_t k, int64_t n0, int64_t n1,
                float* y, int64_t ldy) {
  const auto bytes_of_rows = [&](int64_t a, int64_t b) { return (b - a) * ldw * int64_t(sizeof(W)); };
  const auto row_ptr = [&](int64_t j) { return reinterpret_cast<const char*>(w + j * ldw); };
  for (int64_t b = 0; b < bytes_of_rows(n0, std::min(n1, n0 + kRowsAhead * NR)); b += 64)
    _mm_prefetch(row_ptr(n0) + b, _MM_HINT_T1);
  int64_t j = n0;
  for (; j + NR <= n1; j += NR) {
    const int64_t ahead = std::min(n1, j + kRowsAhead * NR);
    tile<MR, NR>(x, ldx, w + j * ldw, ldw, k, y + j, ldy, row_ptr(ahead),
                 bytes_of_rows(ahead, std::min(n1, ahead + NR)));
  }
  for (; j < n1; ++j) tile<MR, 1>(x, ldx, w + j * ldw, ldw, k, y + j, ldy);
}

// Many rows (prefill, batches above kFewRowsMax): panels::linear_panels (linear_panels_avx2.hpp, shared with
// the quantized formats): kPanelRows weight rows are decoded to f32 once into a panel (step s: the rows' 16
// elements p = 16s..16s+15, zero past k) and every block of x rows runs over it, instead of decoding each
// weight once per block of rows. Same lanes, same order, same bits.
using panels::kPanelRows;

// The next panel's rows come into L2 while the tiles run over this one (`span`, prefetched a share before
// each tile): the rows, 4 KiB pages at k = 2048, were read one after another from DRAM by the packer, each
// page's stream starting cold. `xmoe linear-bench --threads 1 --clock thread --isa avx2 --rows 512`, bf16,
// three alternated runs on Sapphire Rapids: expert gate+up 73-85 → 81-86 GFLOP/s, expert down 75-84 → 79-86,
// attention q 72-74 → 82-89; a 512-token prefill of the 8-layer Qwen3-30B-A3B shape 143 → 153 tok/s.
template <class W>
struct RowPanelPacker {
  const W* w;
  int64_t ldw, k;
  void operator()(int64_t j, int rows, float* panel) const {
    const int64_t steps = (k + 15) / 16;
    const W* const first = w + j * ldw;
    for (int r = 0; r < rows; ++r) {  // rows past `rows` are never read
      for (int64_t s = 0; s < steps; ++s) {
        const int64_t p = s * 16;
        if (p + 16 <= k) {
          panels::store_panel_step(panel, steps, s, r, load8(first + r * ldw + p),
                                   load8(first + r * ldw + p + 8));
        } else {  // the tail: zeros past the end
          W tail[16] = {};
          std::memcpy(static_cast<void*>(tail), first + r * ldw + p, static_cast<size_t>(k - p) * sizeof(W));
          panels::store_panel_step(panel, steps, s, r, load8(tail), load8(tail + 8));
        }
      }
    }
  }
  WeightSpan span(int64_t j, int rows) const {
    return rows_span(w, ldw * int64_t(sizeof(W)), k * int64_t(sizeof(W)), j, rows);
  }
};

template <class W>
void linear_panels(const float* x, int64_t ldx, int64_t m, const W* w, int64_t ldw, int64_t k, int64_t n0,
                   int64_t n1, float* y, int64_t ldy) {
  panels::linear_panels(x, ldx, m, k, n0, n1, y, ldy, RowPanelPacker<W>{w, ldw, k});
}

// Batched decode (4 ≤ m ≤ kFewRowsMax), as the AVX-512 variant's path: weight rows stream once per call in
// groups of kFewCols, converted in registers, against x rows packed in tiles ([step][row][16], zeros past
// k) of at most kFewTileRows rows (so at least 2); the tiles of a group prefetch equal shares of the next
// group into L2, evenly over their steps, as the AVX-512 path's: one thread, f32
// weights, `xmoe linear-bench --threads 1 --clock thread --isa avx2 --rows 4,8,16`, alternated builds, 4 rows
// 21-23 → 28-31 GFLOP/s, 8 rows 34-40 → 45-53, 16 rows 46-48 → 63-68 (the first tile prefetching all of it
// at its own read rate held the L1 fill buffers the others' x loads wait on). Same lanes, same order, same
// bits.
constexpr int kFewTileRows = 3;  // 3 × 2 outputs × 2 halves = 12 accumulators + 2 weights + 1 x of 16
constexpr int kFewCols = 2;
constexpr int64_t kFewRowsMax = 16;

// Copies x rows [0, m) into the few-rows tiles' layout: tiles of up to kFewTileRows rows, tile t's rows
// i0..i1 as [step][row][16] from i0 · steps · 16, zeros past k.
inline void pack_x_steps(const float* x, int64_t ldx, int64_t m, int64_t k, float* out) {
  const int64_t steps = (k + 15) / 16;
  for (int64_t t = 0; t < panels::tile_count(m, kFewTileRows); ++t) {
    const int64_t i0 = panels::tile_start(m, t, kFewTileRows),
                  h = panels::tile_start(m, t + 1, kFewTileRows) - i0;
    float* tile = out + i0 * steps * 16;
    for (int64_t i = 0; i < h; ++i)
      for (int64_t s = 0; s < steps; ++s) {
        float* dst = tile + (s * h + i) * 16;
        const int64_t n = std::min<int64_t>(16, k - s * 16);
        std::memcpy(dst, x + (i0 + i) * ldx + s * 16, static_cast<size_t>(n) * sizeof(float));
        std::fill(dst + n, dst + 16, 0.0f);
      }
  }
}

template <int MR, int NR, class W>
void few_tile(const float* xt, const W* w, int64_t ldw, int64_t k, float* y, int64_t ldy, const char* next,
              int64_t next_bytes) {
  __m256 acc[2][MR][NR];
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h)
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
      for (int j = 0; j < NR; ++j) acc[h][i][j] = _mm256_setzero_ps();
  const auto step = [&](const float* px, const W* const* ws) {
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      __m256 wv[NR];
#pragma GCC unroll 4
      for (int j = 0; j < NR; ++j) wv[j] = load8(ws[j] + 8 * h);
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i) {
        __m256 xv = _mm256_load_ps(px + i * 16 + 8 * h);
        asm("" : "+x"(xv));  // one load per x vector (as in panels::panel_tile)
#pragma GCC unroll 4
        for (int j = 0; j < NR; ++j) acc[h][i][j] = _mm256_fmadd_ps(xv, wv[j], acc[h][i][j]);
      }
    }
  };
  const int64_t full = k / 16;
  const W* ws[NR];
  PrefetchEvenly ahead(next, next_bytes, full);
  for (int64_t s = 0; s < full; ++s) {
    ahead.step();
    for (int j = 0; j < NR; ++j) ws[j] = w + j * ldw + s * 16;
    step(xt + s * MR * 16, ws);
  }
  if (full * 16 < k) {  // the tail, zero-padded to a whole step (zero products leave the lanes unchanged)
    W wt[NR][16] = {};
    for (int j = 0; j < NR; ++j) {
      std::memcpy(static_cast<void*>(wt[j]), w + j * ldw + full * 16,
                  static_cast<size_t>(k - full * 16) * sizeof(W));
      ws[j] = wt[j];
    }
    step(xt + full * MR * 16, ws);
  }
  panels::store_reduced<MR, NR>(acc, y, ldy);
}

// Weight rows [j, j + NR) over every packed x tile (tile t: rows [m·t/tiles, m·(t+1)/tiles)).
template <int NR, class W>
void few_rows_group(const float* xp, int64_t m, int64_t steps, const W* w, int64_t ldw, int64_t k, float* y,
                    int64_t ldy, const char* next, int64_t next_bytes) {
  using TileFn = void (*)(const float*, const W*, int64_t, int64_t, float*, int64_t, const char*, int64_t);
  constexpr TileFn kTiles[kFewTileRows + 1] = {nullptr, few_tile<1, NR, W>, few_tile<2, NR, W>,
                                               few_tile<3, NR, W>};
  const int64_t tiles = (m + kFewTileRows - 1) / kFewTileRows;
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t i0 = m * t / tiles, rows = m * (t + 1) / tiles - i0;
    const WeightSpan ahead = share_of(next, next_bytes, t, tiles);
    kTiles[rows](xp + i0 * steps * 16, w, ldw, k, y + i0 * ldy, ldy, ahead.data, ahead.bytes);
  }
}

template <class W>
void linear_few_rows(const float* x, int64_t ldx, int64_t m, const W* w, int64_t ldw, int64_t k, int64_t n0,
                     int64_t n1, float* y, int64_t ldy) {
  // The x rows in tiles of kFewTileRows rows, as few_rows_group splits them.
  const int64_t steps = (k + 15) / 16;
  Buffer<float> x_buffer;
  float* const xp = x_buffer.ensure(static_cast<size_t>(m * steps * 16));
  pack_x_steps(x, ldx, m, k, xp);
  const auto row_ptr = [&](int64_t j) { return reinterpret_cast<const char*>(w + j * ldw); };
  const auto bytes_of_rows = [&](int64_t a, int64_t b) { return (b - a) * ldw * int64_t(sizeof(W)); };
  int64_t j = n0;
  for (; j + kFewCols <= n1; j += kFewCols)
    few_rows_group<kFewCols>(xp, m, steps, w + j * ldw, ldw, k, y + j, ldy, row_ptr(j + kFewCols),
                             bytes_of_rows(j + kFewCols, std::min(n1, j + 2 * kFewCols)));
  for (; j < n1; ++j) few_rows_group<1>(xp, m, steps, w + j * ldw, ldw, k, y + j, ldy, nullptr, 0);
}

template <class W>
void linear(const LinearArgs& a) {
  const W* w = reinterpret_cast<const W*>(a.w->data);
  const int64_t k = a.w->cols, ldw = a.w->row_bytes / int64_t(sizeof(W));
  if constexpr (std::is_same_v<W, bf16>) {
    if (bf16_pairs::takes_rows(a.m, k))
      return bf16_pairs::linear_few_rows(a.x, a.ldx, a.m, reinterpret_cast<const uint16_t*>(w), ldw, k, a.n0,
                                         a.n1, a.y, a.ldy);
  }
  if (a.m >= 4 && a.m <= kFewRowsMax)
    return linear_few_rows(a.x, a.ldx, a.m, w, ldw, k, a.n0, a.n1, a.y, a.ldy);
  if (a.m >= 4) return linear_panels(a.x, a.ldx, a.m, w, ldw, k, a.n0, a.n1, a.y, a.ldy);
  // Decode: the x rows stay in L1; each weight row streams once through register tiles. 3 rows run as one
  // tile over 2 weight rows (they ran as 2 + 1, the third row's pass over each 256 KiB block again), and one
  // row over BF16 weights reads 2 weight rows a tile instead of 4: few row streams at once, as on AVX-512.
  // `xmoe linear-bench --threads 2 --isa avx2 --rows 1,2,3` on Sapphire Rapids, three alternated runs, bf16:
  // 1 row 22.7-23.5 -> 27.3-32.1 GB/s, 3 rows 20.4-22.0 -> 23.0-26.6; f32 weights (two pages a row) lost
  // 5-10 % with 2 rows a tile at m = 1 and keep 4.
  if (a.m == 3) return rows_block<3, 2>(a.x, a.ldx, w, ldw, k, a.n0, a.n1, a.y, a.ldy);
  if (a.m == 1 && std::is_same_v<W, bf16>)
    return rows_block<1, 2>(a.x, a.ldx, w, ldw, k, a.n0, a.n1, a.y, a.ldy);
  const int64_t kBlockCols =
      std::max<int64_t>(8, (256 << 10) / std::max<int64_t>(1, k * int64_t(sizeof(W))) / 8 * 8);
  for (int64_t c0 = a.n0; c0 < a.n1; c0 += kBlockCols) {
    const int64_t c1 = std::min(a.n1, c0 + kBlockCols);
    if (a.m == 2)
      rows_block<2, 2>(a.x, a.ldx, w, ldw, k, c0, c1, a.y, a.ldy);
    else
      rows_block<1, 4>(a.x, a.ldx, w, ldw, k, c0, c1, a.y, a.ldy);
  }
}

}  // namespace

void linear_f32(const LinearArgs& a) {
  linear<float>(a);
}
void linear_bf16(const LinearArgs& a) {
  linear<bf16>(a);
}
void linear_f16(const LinearArgs& a) {
  linear<f16>(a);
}

}  // namespace xmoe::kernels::avx2
