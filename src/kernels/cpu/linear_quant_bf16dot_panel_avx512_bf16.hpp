// Many-row (prefill) form of the `medium` linears over NVFP4 weights on AVX512-BF16: each group
// of weight rows is decoded once per block of x rows into a small bf16 panel, then register tiles of x rows
// run over it. Decoding stays with the decode-shaped kernels (linear_quant_bf16dot_avx512_bf16.cpp), which
// pass a QuantPanelSource; the arithmetic is linear_quant_bf16dot.hpp's, so the bits are the reference's.
// (FP8's and MXFP4's panels are plain bf16 rows that bf16dot_tiles_avx512_bf16.hpp's tiles run over, as
// over BF16 weights.) Only declarations: the tests read the row thresholds to test either side of them.
#pragma once
#include <cstdint>

#include "kernels/packed_weight.hpp"

namespace xmoe::kernels::avx512_bf16 {

// From this many x rows on, the quantized medium linears take the panel path. Below, decoding the weights in
// registers for every tile of x rows was as fast or faster. NVFP4 (measured when MXFP4 shared its path),
// whose register decode overlaps the products
// well (one thread, linear-bench, medians of 3): panels from 8 rows lose 14-18 % against the register decode
// at 8 rows, 3-6 % at 16; at 20 they are even at k = 768 and 3-5 % slower at k = 2048; at 24 they gain 2-3 %
// at k = 768 and lose 0-2 % at k = 2048, where the register decode already runs at 157-161 GFLOP/s against
// the panel's 166-169 at 512 rows. Expert gate/up (k = 2048) carry twice the down projection's (k = 768)
// work, so 32 stays. FP8 (decoded rows under bf16dot_tiles' 4 × 6 tiles; one thread, 768 × 2048 and 2048 ×
// 768, 200-300 calls): 134 / 126 GFLOP/s against the register decode's 152 / 142 at 8 rows, even at 12-15,
// 158-166 against 111-159 at 16-20.
inline constexpr int64_t kQuantPanelMinRowsFp8 = 12;
// MXFP4 (codes times their power-of-two scale, exact bf16 rows, under bf16dot_tiles' tiles as FP8; one
// thread, 768 × 2048 / 2048 × 768, 300 calls): panel against register decode 121 / 115 vs 155 / 125-135
// GFLOP/s at 4 rows, even at 6 and 8, 151-154 vs 134 / 120 at 9, 157-159 vs 144 / 127 at 10; at 512 rows the
// panel reaches BF16 medium's rate (181-198 against 186-198; the former partial-sum panel 135-158).
inline constexpr int64_t kQuantPanelMinRowsMxfp4 = 8;
inline constexpr int64_t kQuantPanelMinRowsNvfp4 = 32;

// Where a panel's weights come from. decode(context, n, rows, panel) writes weight rows [n, n + rows) for
// every chunk c of the padded k: at panel + (c · rows + j) · 5 · 32 words, row j's 4 vectors of 32 bf16
// weights in the order the chunk's VDPBF16PS steps read them, then its 16 lanes' f32 multipliers (zero for
// lanes wholly past k, so the tiles need no lane mask: those lanes' products are zeros). It returns false
// when it met a code its fast decode does not cover; those rows are then computed by the reference.
struct QuantPanelSource {
  const void* context = nullptr;
  bool (*decode)(const void* context, int64_t n, int rows, uint16_t* panel) = nullptr;
  LinearFn reference = nullptr;
};

// a.y for a.m rows (any m; meant for the thresholds above) and columns [a.n0, a.n1), given x already
// rounded and put in chunk order (xp: row i at xp + i · padded words, zeros past k up to `padded`).
void quant_panel_linear(const LinearArgs& a, const uint16_t* xp, int64_t padded, const QuantPanelSource& src);

}  // namespace xmoe::kernels::avx512_bf16
