// The `medium` matmul precision for BF16 weights on AMX: TDPBF16PS multiplies the bf16 weights, read in place
// from the checkpoint, with activations rounded to bf16 once per call (linear_bf16tile.hpp's arithmetic, for
// every m: decode and prefill, any column block and thread, give the scalar reference's bits).
//
// The product runs as its transpose, yᵀ = W · xᵀ: a weight tile is 16 rows of W as they lie in memory
// (tileloadd takes the row stride, so nothing is copied), and x is packed once per call into tiles of 16 bf16
// pairs × 16 rows (the B operand's pair-interleaved layout). Each accumulator tile is 16 outputs × 16 x rows,
// stored and transposed into y after its k loop. Up to 16 x rows (decode and batched decode) run one weight
// tile at a time against the one x tile; more rows run 2 weight tiles × 2 x tiles, over blocks of x rows
// whose packed copy stays in L2 while the weight tiles stream past.
//
// Decode measured on Sapphire Rapids (2 threads, one step of the 8-layer Qwen3-30B-A3B shape, `xmoe generate
// --profile`): 3 weight tiles per x tile 66-68 ms, 1 tile 61-62 ms; weight tiles of 8 or 4 rows 67 and 80
// ms; software prefetch of the next tiles' rows (strided, or the next group in address order), reading each
// tile's rows in order first, or rotating three registers per operand (tile registers are not renamed, so a
// load waits for the last reader) were level or slower. The VDPBF16PS kernel's one-row-at-a-time stream
// reads lm_head at 31 GB/s against these tiles' 26-27.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/amx_tiles.hpp"
#include "kernels/cpu/bf16dot_lanes_avx512_bf16.hpp"
#include "kernels/cpu/linear_bf16tile.hpp"
#include "kernels/cpu/linear_tiles_amx.hpp"
#include "kernels/cpu/variants.hpp"
#include "util/buffer.hpp"
#include "xmoe/error.hpp"

namespace xmoe::kernels::amx {
namespace {

constexpr int64_t kBlockTiles = 8;  // x tiles per pass over the weights (128 rows; 512 KiB at k = 2048)

// x rows [0, h) (h ≤ 16) as B tiles, step s at out + s · 256 words: word [r][i] holds row i's pair r of the
// step (k = 32 s + 2 r, + 1), rounded to bf16; rows past h and k past the end are zeros.
void pack_x_tile(const float* x, int64_t ldx, int64_t h, int64_t k, int64_t steps, uint32_t* out) {
  if (h < kTile) std::memset(out, 0, static_cast<size_t>(steps * kTileWords) * 4);
  const __m512i pair_rows = _mm512_mullo_epi32(
      _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), _mm512_set1_epi32(16));
  for (int64_t i = 0; i < h; ++i) {
    const float* row = x + i * ldx;
    for (int64_t s = 0; s < steps; ++s) {
      const int64_t p = s * kBf16TileStep;
      alignas(64) uint16_t pairs[32];  // (GCC 12 warns on the 256-to-512 insert intrinsics)
      for (int q = 0; q < 2; ++q) {
        const int64_t rem = std::clamp<int64_t>(k - p - 16 * q, 0, 16);
        const __mmask16 mask = rem == 16 ? __mmask16(0xffff) : __mmask16((1u << rem) - 1);
        _mm256_store_si256(reinterpret_cast<__m256i*>(pairs + 16 * q),
                           avx512_bf16::round_to_bf16(_mm512_maskz_loadu_epi32(mask, row + p + 16 * q)));
      }
      _mm512_i32scatter_epi32(out + s * kTileWords + i, pair_rows, _mm512_load_si512(pairs), 4);
    }
  }
}

struct Call {
  const PackedWeight& w;
  int64_t k, steps;
  bool in_place_k;  // k fills whole steps: full tiles are read from the weight itself
  float* acc;       // 4 accumulator tiles
  // Up to 2 zero-padded tiles of [16][steps · 32] bf16, allocated on first use: only a column range's last
  // tile and a k that is not a multiple of 32 need them.
  mutable Buffer<uint16_t> pad;

  // Tile i of a group: rows [r0, r0 + 16) ∩ [.., n1) of W, in place or through a zero-padded copy.
  void tile_source(int i, int64_t r0, int64_t n1, const std::byte** wt, int64_t* ws) const {
    const int64_t rows = std::min(kTile, n1 - r0);
    if (rows == kTile && in_place_k) {
      wt[i] = w.data + r0 * w.row_bytes;
      ws[i] = w.row_bytes;
      return;
    }
    const int64_t ld = steps * kBf16TileStep;
    uint16_t* dst = pad.ensure(static_cast<size_t>(2 * kTile * ld)) + i * kTile * ld;
    std::memset(dst, 0, static_cast<size_t>(kTile * ld) * 2);
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(dst + r * ld, w.data + (r0 + r) * w.row_bytes, static_cast<size_t>(k) * 2);
    wt[i] = reinterpret_cast<const std::byte*>(dst);
    ws[i] = ld * 2;
  }

  // Outputs [j, j + NT · 16) ∩ [.., n1) for the MT x tiles at xt (rows [0, rows) of them valid, from y).
  template <int NT, int MT>
  void group(int64_t j, int64_t n1, const uint32_t* xt, int64_t rows, float* y, int64_t ldy) const {
    const std::byte* wt[NT];
    int64_t ws[NT];
    for (int i = 0; i < NT; ++i) tile_source(i, j + i * kTile, n1, wt, ws);
    tile_block<NT, MT>(wt, ws, xt, steps, acc);
    for (int i = 0; i < NT; ++i)
      for (int t = 0; t < MT; ++t)
        store_transposed(acc + (i * MT + t) * kTileWords, kTile, std::min(kTile, rows - t * kTile),
                         std::min(kTile, n1 - j - i * kTile), y + t * kTile * ldy + j + i * kTile, ldy);
  }
};

}  // namespace

void linear_bf16_medium(const LinearArgs& a) {
  const PackedWeight& w = *a.w;
  const int64_t k = w.cols, steps = (k + kBf16TileStep - 1) / kBf16TileStep;
  const int64_t tiles = (a.m + kTile - 1) / kTile, block_tiles = std::min(tiles, kBlockTiles);
  Buffer<uint32_t> xp;
  xp.ensure(static_cast<size_t>(block_tiles * steps * kTileWords));
  alignas(64) float acc[4 * kTileWords];
  const Call call{w, k, steps, k % kBf16TileStep == 0, acc, {}};
  const TileConfig config = full_tiles();
  load_config(config);
  for (int64_t t0 = 0; t0 < tiles; t0 += kBlockTiles) {
    const int64_t bt = std::min(kBlockTiles, tiles - t0), row0 = t0 * kTile;
    const int64_t rows = std::min(a.m - row0, bt * kTile);
    for (int64_t t = 0; t < bt; ++t)
      pack_x_tile(a.x + (row0 + t * kTile) * a.ldx, a.ldx, std::min(kTile, rows - t * kTile), k, steps,
                  xp.data() + t * steps * kTileWords);
    float* y = a.y + row0 * a.ldy;
    if (bt == 1) {
      for (int64_t j = a.n0; j < a.n1; j += kTile) call.group<1, 1>(j, a.n1, xp.data(), rows, y, a.ldy);
      continue;
    }
    for (int64_t j = a.n0; j < a.n1; j += 2 * kTile) {
      for (int64_t t = 0; t < bt; t += 2) {
        const uint32_t* xt = xp.data() + t * steps * kTileWords;
        const int64_t r = rows - t * kTile;
        float* yt = y + t * kTile * a.ldy;
        const bool two_x = t + 1 < bt, two_w = j + kTile < a.n1;
        if (two_w && two_x)
          call.group<2, 2>(j, a.n1, xt, r, yt, a.ldy);
        else if (two_w)
          call.group<2, 1>(j, a.n1, xt, r, yt, a.ldy);
        else if (two_x)
          call.group<1, 2>(j, a.n1, xt, r, yt, a.ldy);
        else
          call.group<1, 1>(j, a.n1, xt, r, yt, a.ldy);
      }
    }
  }
  release();
}

}  // namespace xmoe::kernels::amx
