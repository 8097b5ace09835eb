// AVX-512 linear kernels for f32, bf16 and f16 weights: register tiles of MR x rows × NR weight rows, each
// output a 16-lane FMA chain over k followed by one fixed horizontal reduction (linear_lanes.hpp: the order
// never varies, so results equal the reference's bit for bit).
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <memory>
#include <type_traits>
#include <utility>

#include "kernels/cpu/linear_bf16_pairs_avx512.hpp"
#include "kernels/cpu/linear_panels_avx512.hpp"
#include "kernels/cpu/linear_reduce_avx512.hpp"
#include "kernels/cpu/prefetch_slice.hpp"
#include "kernels/cpu/variants.hpp"
#include "xmoe/error.hpp"

namespace xmoe::kernels::avx512 {
namespace {

struct f16 {  // IEEE binary16 bits (F16C converts them)
  uint16_t bits;
};

inline __m512 load_w(const float* p, __mmask16 m) {
  return _mm512_maskz_loadu_ps(m, p);
}
inline __m512 load_w(const bf16* p, __mmask16 m) {
  const __m256i h = _mm256_maskz_loadu_epi16(m, p);
  // maskz forms: the unmasked intrinsics start from an undefined register, which GCC 12 warns about here.
  return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xffff, _mm512_maskz_cvtepu16_epi32(0xffff, h), 16));
}
inline __m512 load_w(const f16* p, __mmask16 m) {
  return _mm512_maskz_cvtph_ps(0xffff, _mm256_maskz_loadu_epi16(m, p));  // maskz: see load_w(bf16)
}

using panels::kPanelRows;
using panels::pack_x;
using panels::reduce16;
using panels::tile_count;
using panels::tile_start;

// `next` / `next_bytes`: memory to prefetch into L2 while this tile runs, spread evenly over its steps (see
// rows_block for why).
template <int MR, int NR, class W>
void tile(const float* x, int64_t ldx, const W* w, int64_t ldw, int64_t k, float* y, int64_t ldy,
          const char* next = nullptr, int64_t next_bytes = 0) {
  __m512 acc[MR][NR];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
  // Each step reads NR·16 weights; prefetching as many bytes of `next` per step covers a tile of the same
  // shape by the time this one ends.
  constexpr int64_t kStepBytes = NR * 16 * int64_t(sizeof(W));
  for (int64_t p = 0; p < k; p += 16) {
    const __mmask16 mask = k - p >= 16 ? __mmask16(0xffff) : __mmask16((1u << (k - p)) - 1);
    if (next_bytes > 0) prefetch_slice(next, p / 16 * kStepBytes, kStepBytes, next_bytes);
    __m512 wv[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) wv[j] = load_w(w + j * ldw + p, mask);
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {
      const __m512 xv = _mm512_maskz_loadu_ps(mask, x + i * ldx + p);
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
  // Unrolled like the loops above, so the accumulators stay registers (GCC otherwise keeps the array in
  // memory and stores every accumulator on every step).
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) y[i * ldy + j] = reduce16(acc[i][j]);
}

// Columns [n0, n1) for MR rows: NR weight rows at a time, then one at a time for the tail.
//
// Decode is bound by how fast the weights stream in. The hardware prefetchers do not cross 4 KiB pages, and a
// bf16 row of k = 2048 is exactly one page, so each of a tile's NR row streams would restart cold at every
// tile. Instead each tile prefetches into L2, while it computes, the rows at least kAheadBytes further on
// (rows are contiguous, so that is one stream); the first of those rows are requested up front. Few streams
// at once keep the DRAM and the L2 prefetcher on few pages: m = 1 reads 2 rows per tile. Two threads
// streaming 2 GiB of bf16 rows of k = 2048 on Zen 4 (median GB/s, 3 runs, the probe's hardware-prefetch loop
// 50-54 in the same runs): 8 rows a tile, one tile ahead 45-47; 4 rows, 2 tiles ahead 49-50; 2 rows, 1 tile
// (8 KiB) ahead 43, 16-128 KiB ahead 53-54 either way; 2 rows without a software prefetch 27. So do 2 and 3
// x rows (batched decode's experts that get 2 or 3 tokens): 2 weight rows a tile instead of 8 and 4, 4 and 6
// accumulators, still well above the stream's rate; `xmoe linear-bench --threads 2 --isa avx512 --rows 2,3`
// on Sapphire Rapids, three alternated runs: 2 rows 22.8-24.5 -> 26.3-29.8 GB/s, 3 rows 20.9-22.6 ->
// 26.3-30.2 (1 row 28-31).
constexpr int64_t kAheadBytes = 16 << 10;

template <int MR, int NR, class W>
void rows_block(const float* x, int64_t ldx, const W* w, int64_t ldw, int64_t k, int64_t n0, int64_t n1,
                float* y, int64_t ldy) {
  const auto bytes_of_rows = [&](int64_t a, int64_t b) { return (b - a) * ldw * int64_t(sizeof(W)); };
  const auto row_ptr = [&](int64_t j) { return reinterpret_cast<const char*>(w + j * ldw); };
  const int64_t tile_bytes = bytes_of_rows(0, NR);
  const int64_t ahead_rows = NR * std::max<int64_t>(1, (kAheadBytes + tile_bytes - 1) / tile_bytes);
  for (int64_t b = 0; b < bytes_of_rows(n0, std::min(n1, n0 + ahead_rows)); b += 64)
    _mm_prefetch(row_ptr(n0) + b, _MM_HINT_T1);
  int64_t j = n0;
  for (; j + NR <= n1; j += NR) {
    const int64_t ahead = std::min(n1, j + ahead_rows);
    tile<MR, NR>(x, ldx, w + j * ldw, ldw, k, y + j, ldy, row_ptr(ahead),
                 bytes_of_rows(ahead, std::min(n1, ahead + NR)));
  }
  for (; j < n1; ++j) tile<MR, 1>(x, ldx, w + j * ldw, ldw, k, y + j, ldy);
}

// Many rows (prefill, batches above kFewRowsMax): panels::linear_panels (linear_panels_avx512.hpp, shared
// with the quantized formats) decodes each weight once per call into f32 panels and runs register tiles over
// them; each output is still one 16-lane chain over ascending p and the fixed reduction, so the results are
// the m < 4 path's (and the reference's) bit for bit. The packer decodes weight rows [j, j + rows) (rows ≤
// kPanelRows; the missing rows are zeros) into `panel`, reading the rows step by step side by side, not one
// after another: four streams in flight instead of one (a bf16 row of k = 2048 is a 4 KiB page, where the
// hardware prefetcher starts again). Decoding alone from DRAM, one thread on Sapphire Rapids: 9.2 → 13.2 GB/s
// of bf16; `xmoe linear-bench --threads 1 --clock thread --isa avx512_bf16 --rows 32`: f32 weights (two pages
// a row) 86–92 → 87–106 GFLOP/s, bf16 level (108–112 either way). The next panel's rows are prefetched by the
// tiles over this one (`span`), evenly: asked for here, in the few microseconds the decoding takes, they held
// the L1 fill buffers the decoding's own loads needed. `xmoe linear-bench --threads 1 --clock thread --isa
// avx512 --rows 512`, bf16, three alternated runs on Sapphire Rapids: expert gate+up 126-134 → 133-142
// GFLOP/s, expert down 135-148 → 149-153, attention q 128-134 → 141-143; a 512-token prefill of the 8-layer
// Qwen3-30B-A3B shape 238 → 249 tok/s.
template <class W>
struct RowPanelPacker {
  const W* w;
  int64_t ldw, k;
  void operator()(int64_t j, int rows, float* panel) const {
    const int64_t steps = (k + 15) / 16;
    const W* const first = w + j * ldw;
    for (int64_t s = 0; s < steps; ++s) {
      const int64_t p = s * 16;
      const __mmask16 mask = k - p >= 16 ? __mmask16(0xffff) : __mmask16((1u << (k - p)) - 1);
#pragma GCC unroll 4
      for (int r = 0; r < kPanelRows; ++r)
        _mm512_store_ps(panel + (s * kPanelRows + r) * 16,
                        r < rows ? load_w(first + r * ldw + p, mask) : _mm512_setzero_ps());
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

// Batched decode (4 ≤ m ≤ kFewRowsMax): the weights stream from memory once per call in groups of kFewCols
// rows, converted in registers (no f32 panel written and read back), against x rows packed tile by tile
// ([step][row][16]: a tile's x loads are one contiguous stream instead of rows a multiple of 4 KiB apart
// that share L1 sets). Every x tile of up to kFewTileRows rows runs over a group while its rows are in L1;
// the first tile prefetches the next group into L2 (into L1 it would evict the group's own rows: they are
// 4 KiB apart too). Tiles of 4 rows × 6 columns (24 accumulators) did better than 8 × 3 at m = 8 and than
// the panel path at m = 16, which reaches the FMA rate. Each output is still one 16-lane chain over
// ascending p and the fixed reduction.
//
// BF16 weights take bf16_pairs::linear_few_rows (linear_bf16_pairs_avx512.hpp) instead: one shuffle per 16
// weights. f32 and f16 weights have no shuffle to save and keep 16-column steps over 6 rows.
constexpr int kFewTileRows = 4;
constexpr int kFewCols = 6;  // 4 × 6 accumulators + 6 weights + 1 x of the 32 registers
constexpr int64_t kFewRowsMax = 16;

// y[i, j] for the MR x rows of one packed tile (xt: [step][MR][16]) and NR weight rows read in place;
// prefetches `next_bytes` of `next` into L2 over the steps: NR rows' step a step, the rate it reads its own
// rows, when it is the group's only tile, else evenly (as the BF16 pair kernel's tiles).
template <int MR, int NR, class W, bool Evenly>
void few_tile(const float* xt, const W* w, int64_t ldw, int64_t k, float* y, int64_t ldy, const char* next,
              int64_t next_bytes) {
  __m512 acc[MR][NR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
  constexpr int64_t kStepBytes = NR * 16 * int64_t(sizeof(W));
  const int64_t steps = (k + 15) / 16;
  // One step: the MR packed x vectors at px times the NR weight vectors wv.
  const auto step = [&](const float* px, const __m512(&wv)[NR]) {
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512 xv = _mm512_load_ps(px + i * 16);
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  };
  PrefetchEvenly ahead(next, next_bytes, steps);
  for (int64_t s = 0; s < steps; ++s) {
    const int64_t p = s * 16;
    const __mmask16 mask = k - p >= 16 ? __mmask16(0xffff) : __mmask16((1u << (k - p)) - 1);
    if constexpr (Evenly)
      ahead.step();
    else if (next_bytes > 0)
      prefetch_slice(next, s * kStepBytes, kStepBytes, next_bytes);
    __m512 wv[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) wv[j] = load_w(w + j * ldw + p, mask);
    step(xt + s * MR * 16, wv);
  }
  lane_tree::store_sums<MR, NR>(acc, y, ldy);
}

// Weight rows [j, j + NR) over every packed x tile (tiles of at most TR rows), each tile prefetching an
// equal share of `next` evenly. The first tile prefetching all of it at its own read rate held the L1 fill
// buffers the tiles' x loads from L2 wait on: one thread, f32 weights, k = 2048 and 768 (`xmoe linear-bench
// --threads 1 --clock thread --isa avx512 --rows 4,8,16`, alternated builds) 8 rows 42-45 → 48-52 GFLOP/s,
// 16 rows 60-67 → 70-82, 4 rows (one tile) level.
template <int NR, int TR, class W>
void few_rows_group(const float* xp, int64_t m, int64_t steps, const W* w, int64_t ldw, int64_t k, float* y,
                    int64_t ldy, const char* next, int64_t next_bytes) {
  using TileFn = void (*)(const float*, const W*, int64_t, int64_t, float*, int64_t, const char*, int64_t);
  constexpr auto kTiles = []<bool Evenly, int... R>(std::integer_sequence<int, R...>) {
    return std::array<TileFn, TR + 1>{nullptr, few_tile<R + 1, NR, W, Evenly>...};
  };
  constexpr auto kOnlyTile = kTiles.template operator()<false>(std::make_integer_sequence<int, TR>{});
  constexpr auto kSharingTiles = kTiles.template operator()<true>(std::make_integer_sequence<int, TR>{});
  const int64_t tiles = tile_count(m, TR);
  if (tiles == 1) return kOnlyTile[m](xp, w, ldw, k, y, ldy, next, next_bytes);
  const int64_t share = (next_bytes + tiles - 1) / tiles;
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t i0 = tile_start(m, t, TR);
    const int64_t at = t * share, bytes = std::clamp<int64_t>(next_bytes - at, 0, share);
    kSharingTiles[tile_start(m, t + 1, TR) - i0](xp + i0 * steps * 16, w, ldw, k, y + i0 * ldy, ldy,
                                                 bytes > 0 ? next + at : nullptr, bytes);
  }
}

// Groups of C weight rows against x tiles of at most TR rows.
template <int C, int TR, class W>
void few_rows(const float* x, int64_t ldx, int64_t m, const W* w, int64_t ldw, int64_t k, int64_t n0,
              int64_t n1, float* y, int64_t ldy) {
  const int64_t steps = (k + 15) / 16;
  Buffer<float> x_buffer;
  float* const xp = x_buffer.ensure(static_cast<size_t>(m * steps * 16));
  pack_x(x, ldx, m, k, xp, TR);
  const auto row_ptr = [&](int64_t j) { return reinterpret_cast<const char*>(w + j * ldw); };
  const auto bytes_of_rows = [&](int64_t a, int64_t b) { return (b - a) * ldw * int64_t(sizeof(W)); };
  for (int64_t b = 0; b < bytes_of_rows(n0, std::min(n1, n0 + C)); b += 64)
    _mm_prefetch(row_ptr(n0) + b, _MM_HINT_T1);
  int64_t j = n0;
  for (; j + C <= n1; j += C)
    few_rows_group<C, TR>(xp, m, steps, w + j * ldw, ldw, k, y + j, ldy, row_ptr(j + C),
                          bytes_of_rows(j + C, std::min(n1, j + 2 * C)));
  for (; j < n1; ++j) few_rows_group<1, TR>(xp, m, steps, w + j * ldw, ldw, k, y + j, ldy, nullptr, 0);
}

template <class W>
void linear(const LinearArgs& a) {
  const float* x = a.x;
  const int64_t m = a.m, ldx = a.ldx, n0 = a.n0, n1 = a.n1, ldy = a.ldy;
  float* y = a.y;
  const W* w = reinterpret_cast<const W*>(a.w->data);
  const int64_t k = a.w->cols, ldw = a.w->row_bytes / int64_t(sizeof(W));
  // Decode: the x rows stay in L1; each weight row streams once through register tiles.
  if (m == 3) return rows_block<3, 2>(x, ldx, w, ldw, k, n0, n1, y, ldy);
  if (m == 2) return rows_block<2, 2>(x, ldx, w, ldw, k, n0, n1, y, ldy);
  if (m == 1) return rows_block<1, 2>(x, ldx, w, ldw, k, n0, n1, y, ldy);
  if constexpr (std::is_same_v<W, bf16>) {
    if (bf16_pairs::takes_rows(m, k))
      return bf16_pairs::linear_few_rows(x, ldx, m, reinterpret_cast<const uint16_t*>(w), ldw, k, n0, n1, y,
                                         ldy);
  }
  if (m <= kFewRowsMax) return few_rows<kFewCols, kFewTileRows>(x, ldx, m, w, ldw, k, n0, n1, y, ldy);
  linear_panels(x, ldx, m, w, ldw, k, n0, n1, y, ldy);
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

}  // namespace xmoe::kernels::avx512
