// The `medium` matmul precision for BF16 weights on AVX512-BF16: VDPBF16PS multiplies the bf16 weights, read
// in place from the checkpoint, with activations rounded to bf16 once per call, two products per f32 lane
// at twice the f32 FMA rate. Every output is one 16-lane VDPBF16PS chain over steps of 32 k followed by
// linear_lanes.hpp's fixed reduction (linear_bf16dot.hpp), for every m: decode and prefill, any column block
// and thread, give the scalar reference's bits.
//
// The register tiles and the x layout are bf16dot_tiles_avx512_bf16.hpp's (shared with the FP8 linear); here
// weight rows stream in place in groups of kGroupCols (kWideGroupCols for the 8-row tile), each group
// against every tile of a chunk of x rows while its rows are in L1/L2, with the group two on prefetched into
// L2 meanwhile.
#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <memory>

#include "kernels/cpu/bf16dot_tiles_avx512_bf16.hpp"
#include "kernels/cpu/linear_bf16dot.hpp"
#include "kernels/cpu/linear_reduce_avx512.hpp"
#include "kernels/cpu/variants.hpp"
#include "xmoe/error.hpp"

namespace xmoe::kernels::avx512_bf16 {
namespace {

using namespace bf16dot_tiles;

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

// Each group asks for the group kAhead groups on to come into L2: with one group ahead, 8 rows ran about 5 %
// slower (the weights stream at ~12 GB/s there, and a group computes for only a few microseconds).
constexpr int64_t kAhead = 2;

// Decode (one to three x rows) takes one weight row at a time and prefetches the row at least
// kDecodeAheadBytes on, as the f32 decode does (linear_avx512.cpp): one stream per thread keeps Zen 4's DRAM
// pages and L2 prefetcher on one page at a time. One decode step of the 8-layer Qwen3-30B-A3B shape (`xmoe
// linear-bench --model DIR --matmul-precision medium`, 2 threads, alternated runs while the read probe read
// 46-54 GB/s): lm_head 40-42 GB/s with 6-row groups, 42-43 with 2-row groups 4-8 rows ahead, 46-52 with 1 row
// 4-16 rows (16-64 KiB) ahead; routed experts 39-40 → 41-45, attention 33-34 → 36-39. In the machine's ~35
// GB/s state all read alike (within 1 GB/s). 2 and 3 x rows (batched decode's experts that get 2 or 3 tokens)
// do the same instead of 3-row groups: `xmoe linear-bench --threads 2 --isa avx512_bf16 --matmul-precision
// medium --rows 2,3` on Sapphire Rapids, three alternated runs: 2 rows 25.6-26.5 → 28.0-30.9 GB/s, 3
// rows 23.7-24.5 → 26.1-27.5.
//
// On AMD (Zen 4) the same one-row decode reads faster with no software prefetch at all: its rows follow one
// another, one sequential stream per thread, which Zen 4's hardware prefetchers alone keep up with, as the
// read probe's loop without prefetches (read_bandwidth.cpp) shows. `xmoe linear-bench --model DIR
// --matmul-precision medium` on a 2-vCPU Zen 4, the two alternated 8 times: a decode step's weight ops
// 86.9-92.5 % of the read probe (median 90.5) → 93.8-100.3 % (96) with the probe at 34-37 GB/s, 85 → 89 %
// at 58-60 GB/s; `generate --measure-bandwidth` alternated 8 times, per-step median share at the probes
// between steps 84.2-86.6 % → 89.8-92.5 % (34-38 GB/s), 79 → 82-84 % (62-67 GB/s). Sapphire Rapids was tuned
// with the prefetches (the figures above), so the kernel table picks by vendor (kernel_table.cpp).
//
// That holds for one x row only: 2 and 3 rows keep the prefetches on Zen 4 too. Their x rows (2-3 × 2k
// bytes) no longer stay in L1 beside the weight row streaming through, so each step waits on L2 for x as
// well, and the hardware prefetchers alone fall behind: one thread streaming distinct weight copies from
// DRAM, the two forms alternated call by call, the prefetching one ran 3 rows at 1.24-1.56× the speed
// (2048 × 4096: 13.5 → 21.1 GB/s; 4096 × 2048, 1536 × 2048, 2048 × 768: 1.34, 1.24, 1.35×) and 2 rows at
// 1.14-1.35× (0.85× at 1536 × 2048), one row at 0.89-1.17×.
constexpr int64_t kDecodeAheadBytes = 16 << 10;

// The columns [n0, n1) for one chunk of packed x rows, NR weight rows at a time, then one at a time; each
// group prefetches the rows `ahead_rows` on (0: none).
template <int NR>
void chunk_columns(const uint16_t* xp, int64_t rows, int64_t steps, const bf16* w, int64_t ldw, int64_t k,
                   int64_t n0, int64_t n1, float* y, int64_t ldy, int64_t ahead_rows) {
  const auto row_ptr = [&](int64_t j) { return reinterpret_cast<const char*>(w + j * ldw); };
  const auto bytes_of_rows = [&](int64_t r0, int64_t r1) { return (r1 - r0) * ldw * 2; };
  for (int64_t b = 0; b < bytes_of_rows(n0, std::min(n1, n0 + ahead_rows)); b += 64)
    _mm_prefetch(row_ptr(n0) + b, _MM_HINT_T1);
  int64_t j = n0;
  for (; j + NR <= n1; j += NR) {
    const int64_t ahead = std::min(n1, j + ahead_rows);
    group<NR>(xp, rows, steps, w + j * ldw, ldw, k, y + j, ldy, ahead_rows > 0 ? row_ptr(ahead) : nullptr,
              ahead_rows > 0 ? bytes_of_rows(ahead, std::min(n1, ahead + NR)) : 0);
  }
  for (; j < n1; ++j) group<1>(xp, rows, steps, w + j * ldw, ldw, k, y + j, ldy, nullptr, 0);
}

// kOneRowPrefetch: whether decode of one x row prefetches the weight rows ahead (2 and 3 rows always do).
template <bool kOneRowPrefetch>
void linear_bf16_medium_rows(const LinearArgs& a) {
  const bf16* w = reinterpret_cast<const bf16*>(a.w->data);
  const int64_t k = a.w->cols, ldw = a.w->row_bytes / 2, steps = (k + 31) / 32;
  const int64_t decode_ahead_rows = std::max<int64_t>(1, (kDecodeAheadBytes + ldw * 2 - 1) / (ldw * 2));
  const int64_t chunk = std::min(a.m, kChunkRows);
  std::unique_ptr<uint16_t[], FreeDeleter> xp(
      static_cast<uint16_t*>(std::aligned_alloc(64, static_cast<size_t>(chunk * steps * 64))));
  XMOE_CHECK(xp != nullptr, "linear: out of memory for ", chunk, " bf16 rows of ", k);
  for (int64_t c0 = 0; c0 < a.m; c0 += kChunkRows) {
    const int64_t rows = std::min(kChunkRows, a.m - c0);
    pack_x(a.x + c0 * a.ldx, a.ldx, rows, k, xp.get());
    float* y = a.y + c0 * a.ldy;
    if (rows <= 3)
      chunk_columns<1>(xp.get(), rows, steps, w, ldw, k, a.n0, a.n1, y, a.ldy,
                       kOneRowPrefetch || rows > 1 ? decode_ahead_rows : 0);
    else if (tile_rows(rows, steps) == kWideTileRows)
      chunk_columns<kWideGroupCols>(xp.get(), rows, steps, w, ldw, k, a.n0, a.n1, y, a.ldy,
                                    kAhead * kWideGroupCols);
    else
      chunk_columns<kGroupCols>(xp.get(), rows, steps, w, ldw, k, a.n0, a.n1, y, a.ldy, kAhead * kGroupCols);
  }
}

}  // namespace

void linear_bf16_medium(const LinearArgs& a) {
  linear_bf16_medium_rows<true>(a);
}
void linear_bf16_medium_hardware_prefetch(const LinearArgs& a) {
  linear_bf16_medium_rows<false>(a);
}

}  // namespace xmoe::kernels::avx512_bf16
