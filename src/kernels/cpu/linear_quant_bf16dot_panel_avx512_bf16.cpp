// The panel path of the NVFP4 `medium` linear (linear_quant_bf16dot_panel_avx512_bf16.hpp). With many
// x rows, decoding the weights in registers for every small tile of x rows costs as much as the products and
// streams all of x past every few weight rows. Here the x rows are taken in blocks that stay in L2; for each
// block, each group of NR weight rows is decoded once into an L1-sized panel (the exact words and multipliers
// the register decode produces) and every tile of up to MR x rows of the block runs over it. Each output is
// still one chain per lane and chunk with the multiplier applied by one FMA, then reduce16's lane tree, so
// the bits are the reference's for any tiling, m, column range or thread count.
#include "kernels/cpu/linear_quant_bf16dot_panel_avx512_bf16.hpp"

#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <memory>

#include "kernels/cpu/bf16dot_lanes_avx512_bf16.hpp"
#include "kernels/cpu/linear_quant.hpp"
#include "kernels/cpu/linear_reduce_avx512.hpp"
#include "xmoe/error.hpp"

namespace xmoe::kernels::avx512_bf16 {
namespace {

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

// Register tiles: MR x rows × NR weight rows, sized to the 32 registers: 4 × 3 = 12 accumulators + 12 partial
// sums + 3 weights + 1 x. Each chunk is 4 VDPBF16PS steps (linear_quant_bf16dot.hpp's C / 32).
constexpr int kRows = 4, kCols = 3, kSteps = 4;

// x bytes of one block of rows: the block is re-read once per weight group, so it must stay in L2 (1 MiB
// here, shared with the panel and the weights streaming through).
constexpr int64_t kBlockBytes = 384 * 1024;

// y[i, j] for MR x rows (x: rows `padded` words apart) and the NR weight rows of a decoded panel, step by
// step over the whole tile, partial sums in registers, which keeps the four dependent VDPBF16PS of a chain
// apart (about 10 % faster than back to back at 512 rows).
template <int MR, int NR>
void panel_tile(const uint16_t* x, int64_t padded, const uint16_t* panel, int64_t chunks, float* y,
                int64_t ldy) {
  constexpr int64_t kRowWords = (kSteps + 1) * 32;
  __m512 acc[MR][NR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t c = 0; c < chunks; ++c) {
    const uint16_t* pc = panel + c * NR * kRowWords;
    const uint16_t* xc = x + c * kSteps * 32;
    __m512 part[MR][NR];
#pragma GCC unroll 4
    for (int s = 0; s < kSteps; ++s) {
      __m512bh wv[NR];
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) wv[j] = (__m512bh)_mm512_load_si512(pc + j * kRowWords + s * 32);
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
        const __m512bh xv = (__m512bh)_mm512_load_si512(xc + i * padded + s * 32);
#pragma GCC unroll 8
        for (int j = 0; j < NR; ++j)
          part[i][j] = _mm512_dpbf16_ps(s == 0 ? _mm512_setzero_ps() : part[i][j], xv, wv[j]);
      }
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j)
        acc[i][j] = _mm512_fmadd_ps(part[i][j], _mm512_load_ps(pc + j * kRowWords + kSteps * 32), acc[i][j]);
  }
  lane_tree::store_sums<MR, NR>(acc, y, ldy);
}

using TileFn = void (*)(const uint16_t*, int64_t, const uint16_t*, int64_t, float*, int64_t);

// kTilesOf<NR, 1, 2, 3, 4>[mr - 1] = the tile of mr x rows and NR weight rows.
template <int NR, int... MR>
constexpr TileFn kTilesOf[] = {panel_tile<MR, NR>...};

TileFn tile_for(int64_t rows, int cols) {
  static_assert(kRows == 4 && kCols == 3);
  switch (cols) {
    case 1:
      return kTilesOf<1, 1, 2, 3, 4>[rows - 1];
    case 2:
      return kTilesOf<2, 1, 2, 3, 4>[rows - 1];
    default:
      return kTilesOf<3, 1, 2, 3, 4>[rows - 1];
  }
}

// Parts of nearly equal size: part t of `count` parts of `total` covers [total · t / count, total · (t + 1) /
// count), so 10 rows in tiles of at most 4 are 3 + 3 + 4, not 4 + 4 + 2.
inline int64_t part_start(int64_t total, int64_t t, int64_t count) {
  return total * t / count;
}

}  // namespace

void quant_panel_linear(const LinearArgs& a, const uint16_t* xp, int64_t padded,
                        const QuantPanelSource& src) {
  if (a.m == 0 || a.n0 == a.n1) return;
  constexpr int64_t kRowWords = (kSteps + 1) * 32;
  const int64_t chunks = padded / (kSteps * 32);
  std::unique_ptr<uint16_t[], FreeDeleter> panel(
      static_cast<uint16_t*>(std::aligned_alloc(64, static_cast<size_t>(kCols * chunks * kRowWords * 2))));
  XMOE_CHECK(panel != nullptr, "linear: out of memory for a weight panel of ", chunks, " chunks");
  const int64_t block_rows = std::max<int64_t>(kRows, kBlockBytes / (padded * 2));
  const int64_t blocks = (a.m + block_rows - 1) / block_rows;
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t r0 = part_start(a.m, b, blocks), rows = part_start(a.m, b + 1, blocks) - r0;
    const int64_t tiles = (rows + kRows - 1) / kRows;
    for (int64_t n = a.n0; n < a.n1; n += kCols) {
      const int cols = static_cast<int>(std::min<int64_t>(kCols, a.n1 - n));
      if (!src.decode(src.context, n, cols, panel.get())) {
        quant::reference_part(a, src.reference, r0, rows, n, cols);
        continue;
      }
      for (int64_t t = 0; t < tiles; ++t) {
        const int64_t i0 = r0 + part_start(rows, t, tiles), h = r0 + part_start(rows, t + 1, tiles) - i0;
        tile_for(h, cols)(xp + i0 * padded, padded, panel.get(), chunks, a.y + i0 * a.ldy + n, a.ldy);
      }
    }
  }
}

}  // namespace xmoe::kernels::avx512_bf16
