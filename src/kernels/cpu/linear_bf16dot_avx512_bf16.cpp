// The `medium` matmul precision for BF16 weights on AVX512-BF16: VDPBF16PS multiplies the bf16 weights, read
// in place from the checkpoint, with activations rounded to bf16 once per call, two products per f32 lane
// at twice the f32 FMA rate. Every output is one 16-lane VDPBF16PS chain over steps of 32 k followed by
// linear_lanes.hpp's fixed reduction (linear_bf16dot.hpp), for every m: decode and prefill, any column block
// and thread, give the scalar reference's bits.
//
// Layout follows the f32 kernels' batched path (linear_avx512.cpp): x rows are converted into tiles of at
// most kTileRows rows (5 to 8 rows: one tile) laid out step by step ([step][row][32 bf16]), so a tile's x
// loads are one contiguous stream; weight rows stream in groups of kGroupCols (kWideGroupCols for the 8-row
// tile), each group against every tile of a chunk of x rows while its rows are in L1/L2, with the group two
// on prefetched into L2 meanwhile.
#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <memory>

#include "kernels/cpu/bf16dot_lanes_avx512_bf16.hpp"
#include "kernels/cpu/linear_bf16dot.hpp"
#include "kernels/cpu/linear_reduce_avx512.hpp"
#include "kernels/cpu/variants.hpp"
#include "xmoe/error.hpp"

namespace xmoe::kernels::avx512_bf16 {
namespace {

constexpr int kTileRows = 4;
constexpr int kGroupCols = 6;       // 4 × 6 accumulators + 6 weights + 1 x of the 32 registers
constexpr int64_t kChunkRows = 96;  // x rows per pass over the weights: their bf16 copy stays in L2

inline __mmask32 step_mask(int64_t k, int64_t p) {
  return k - p >= 32 ? __mmask32(0xffffffffu) : __mmask32((1u << (k - p)) - 1);
}

// 5 to 8 rows run as one tile of kWideTileRows × kWideGroupCols: each weight vector loaded feeds all rows,
// where two tiles of 4 × 6 load every weight twice. 9 to 16 rows do so too (two tiles) while a tile's x rows
// stay in L1 beside the group (kWideTileBytes: 16 rows at k = 768, 12 at k = 1024); past that the x rows come
// from L2 and 4 × 6 tiles, which load x half as often per product, were as fast (measured at k = 1024 and
// 2048).
constexpr int kWideTileRows = 8;
constexpr int kWideGroupCols = 3;  // 8 × 3 accumulators + 3 weights + 1 x
constexpr int64_t kWideTileBytes = 12 * 1024;

inline int64_t tile_rows(int64_t m, int64_t steps) {
  const bool wide =
      m <= kWideTileRows || (m <= 2 * kWideTileRows && (m + 1) / 2 * steps * 64 <= kWideTileBytes);
  return m > kTileRows && wide ? kWideTileRows : kTileRows;
}
inline int64_t tile_count(int64_t m, int64_t steps) {
  return (m + tile_rows(m, steps) - 1) / tile_rows(m, steps);
}
// Tiles of nearly equal heights (10 rows in tiles of 4 as 3 + 3 + 4, not 4 + 4 + 2): tile t covers
// [tile_start(t), tile_start(t+1)).
inline int64_t tile_start(int64_t m, int64_t t, int64_t steps) {
  return m * t / tile_count(m, steps);
}

// x rows [0, m) rounded to bf16 into tile layout: tile t's h rows as [step][row][32] from i0 · steps · 32,
// zeros past k.
void pack_x(const float* x, int64_t ldx, int64_t m, int64_t k, uint16_t* out) {
  const int64_t steps = (k + 31) / 32;
  for (int64_t t = 0; t < tile_count(m, steps); ++t) {
    const int64_t i0 = tile_start(m, t, steps), h = tile_start(m, t + 1, steps) - i0;
    uint16_t* tile = out + i0 * steps * 32;
    for (int64_t i = 0; i < h; ++i) {
      const float* row = x + (i0 + i) * ldx;
      for (int64_t s = 0; s < steps; ++s) {
        const int64_t p = s * 32;
        uint16_t* out_step = tile + (s * h + i) * 32;
        for (int half = 0; half < 2; ++half) {
          const int64_t rem = std::clamp<int64_t>(k - p - 16 * half, 0, 16);
          const __mmask16 mask = rem == 16 ? __mmask16(0xffff) : __mmask16((1u << rem) - 1);
          _mm256_store_si256(reinterpret_cast<__m256i*>(out_step + 16 * half),
                             round_to_bf16(_mm512_maskz_loadu_epi32(mask, row + p + 16 * half)));
        }
      }
    }
  }
}

// y[i, j] for the MR rows of one packed x tile and NR weight rows read in place; prefetches `next_bytes` of
// `next` into L2, spread over the steps.
template <int MR, int NR, bool Share>
void tile(const uint16_t* xt, const bf16* w, int64_t ldw, int64_t k, float* y, int64_t ldy, const char* next,
          int64_t next_bytes) {
  __m512 acc[MR][NR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
  const int64_t steps = (k + 31) / 32;
  // Whole lines of `next` per step: a group's NR rows when one tile prefetches all of them, else enough to
  // cover this tile's share by its last step.
  const int64_t step_bytes = Share ? (next_bytes + steps * 64 - 1) / (steps * 64) * 64 : NR * 64;
  for (int64_t s = 0; s < steps; ++s) {
    const int64_t p = s * 32;
    const __mmask32 mask = step_mask(k, p);
    if (next_bytes > 0) {
      const int64_t at = s * step_bytes;
      for (int64_t b = at; b < std::min(at + step_bytes, next_bytes); b += 64)
        _mm_prefetch(next + b, _MM_HINT_T1);
    }
    __m512bh wv[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) wv[j] = (__m512bh)_mm512_maskz_loadu_epi16(mask, w + j * ldw + p);
    const uint16_t* px = xt + s * MR * 32;
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512bh xv = (__m512bh)_mm512_load_si512(px + i * 32);
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], xv, wv[j]);
    }
  }
  lane_tree::store_sums<MR, NR>(acc, y, ldy);
}

using TileFn = void (*)(const uint16_t*, const bf16*, int64_t, int64_t, float*, int64_t, const char*,
                        int64_t);
// Tiles above kTileRows rows exist only with kWideGroupCols columns or fewer (32 registers hold the
// accumulators).
template <int MR, int NR, bool Share>
constexpr TileFn tile_fn() {
  if constexpr (MR > kTileRows && NR > kWideGroupCols)
    return nullptr;
  else
    return tile<MR, NR, Share>;
}
// The tile function by height (1 to kWideTileRows rows).
template <int NR, bool Share>
constexpr TileFn kTileTable[kWideTileRows + 1] = {nullptr,
                                                  tile_fn<1, NR, Share>(),
                                                  tile_fn<2, NR, Share>(),
                                                  tile_fn<3, NR, Share>(),
                                                  tile_fn<4, NR, Share>(),
                                                  tile_fn<5, NR, Share>(),
                                                  tile_fn<6, NR, Share>(),
                                                  tile_fn<7, NR, Share>(),
                                                  tile_fn<8, NR, Share>()};

// Weight rows [j, j + NR) over every packed x tile, which prefetch `next` (see kAhead) between them: with
// several tiles each asks for an equal share of its lines. When the first tile asked for all of them (a
// group is 24 KiB at k = 2048, requested in a quarter of the group's time), m = 16 ran at 146 / 147 GFLOP/s
// per core at k = 2048 / 4096, m = 12 at 135 and m = 32 at 169; shared, 159 / 174, 152 and 182 (one
// thread's CPU time, medians of 4 alternated runs, weights streamed from DRAM). One tile keeps the fixed NR
// lines per step.
template <int NR>
void group(const uint16_t* xp, int64_t m, int64_t steps, const bf16* w, int64_t ldw, int64_t k, float* y,
           int64_t ldy, const char* next, int64_t next_bytes) {
  const int64_t tiles = tile_count(m, steps);
  if (tiles == 1) return kTileTable<NR, false>[m](xp, w, ldw, k, y, ldy, next, next_bytes);
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t i0 = tile_start(m, t, steps);
    const int64_t lines = (next_bytes + 63) / 64, l0 = lines * t / tiles, l1 = lines * (t + 1) / tiles;
    kTileTable<NR, true>[tile_start(m, t + 1, steps) - i0](xp + i0 * steps * 32, w, ldw, k, y + i0 * ldy, ldy,
                                                           next + l0 * 64,
                                                           std::min(next_bytes, l1 * 64) - l0 * 64);
  }
}

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

// Each group asks for the group kAhead groups on to come into L2: with one group ahead, 8 rows ran about 5 %
// slower (the weights stream at ~12 GB/s there, and a group computes for only a few microseconds).
constexpr int64_t kAhead = 2;

// The columns [n0, n1) for one chunk of packed x rows, NR weight rows at a time, then one at a time.
template <int NR>
void chunk_columns(const uint16_t* xp, int64_t rows, int64_t steps, const bf16* w, int64_t ldw, int64_t k,
                   int64_t n0, int64_t n1, float* y, int64_t ldy) {
  const auto row_ptr = [&](int64_t j) { return reinterpret_cast<const char*>(w + j * ldw); };
  const auto bytes_of_rows = [&](int64_t r0, int64_t r1) { return (r1 - r0) * ldw * 2; };
  for (int64_t b = 0; b < bytes_of_rows(n0, std::min(n1, n0 + kAhead * NR)); b += 64)
    _mm_prefetch(row_ptr(n0) + b, _MM_HINT_T1);
  int64_t j = n0;
  for (; j + NR <= n1; j += NR) {
    const int64_t ahead = std::min(n1, j + kAhead * NR);
    group<NR>(xp, rows, steps, w + j * ldw, ldw, k, y + j, ldy, row_ptr(ahead),
              bytes_of_rows(ahead, std::min(n1, ahead + NR)));
  }
  for (; j < n1; ++j) group<1>(xp, rows, steps, w + j * ldw, ldw, k, y + j, ldy, nullptr, 0);
}

}  // namespace

void linear_bf16_medium(const LinearArgs& a) {
  const bf16* w = reinterpret_cast<const bf16*>(a.w->data);
  const int64_t k = a.w->cols, ldw = a.w->row_bytes / 2, steps = (k + 31) / 32;
  const int64_t chunk = std::min(a.m, kChunkRows);
  std::unique_ptr<uint16_t[], FreeDeleter> xp(
      static_cast<uint16_t*>(std::aligned_alloc(64, static_cast<size_t>(chunk * steps * 64))));
  XMOE_CHECK(xp != nullptr, "linear: out of memory for ", chunk, " bf16 rows of ", k);
  for (int64_t c0 = 0; c0 < a.m; c0 += kChunkRows) {
    const int64_t rows = std::min(kChunkRows, a.m - c0);
    pack_x(a.x + c0 * a.ldx, a.ldx, rows, k, xp.get());
    float* y = a.y + c0 * a.ldy;
    if (tile_rows(rows, steps) == kWideTileRows)
      chunk_columns<kWideGroupCols>(xp.get(), rows, steps, w, ldw, k, a.n0, a.n1, y, a.ldy);
    else
      chunk_columns<kGroupCols>(xp.get(), rows, steps, w, ldw, k, a.n0, a.n1, y, a.ldy);
  }
}

}  // namespace xmoe::kernels::avx512_bf16
