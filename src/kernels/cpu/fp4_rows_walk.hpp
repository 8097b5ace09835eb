// The FP4 decode paths' walk over a call's weight rows (m ≤ 3), shared by the AVX2 and AVX-512 files: tiles
// of NR rows and then single rows, the first two tiles' bytes prefetched into L2 up front, each tile told to
// prefetch two tiles ahead at its own column, and the scale codes of the tile after next prefetched per tile.
// In an unnamed namespace: each vector-ISA file compiles its own copy with its own flags.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kernels/packed_weight.hpp"

namespace xmoe::kernels {
namespace {

// tile.template operator()<R>(data, codes, y, ahead) computes outputs y[i · ldy + j] of rows j < R whose
// bytes start at data and scale codes at codes, prefetching `ahead` bytes past each row's current column.
template <int NR, class Tile>
void walk_fp4_rows(const LinearArgs& a, Tile&& tile) {
  const PackedWeight& w = *a.w;
  const auto* data = reinterpret_cast<const uint8_t*>(w.data);
  const auto* codes = reinterpret_cast<const uint8_t*>(w.scales);
  const int64_t ahead = 2 * NR * w.row_bytes;
  for (int64_t b = 0; b < std::min(ahead, (a.n1 - a.n0) * w.row_bytes); b += 64)
    _mm_prefetch(reinterpret_cast<const char*>(data + a.n0 * w.row_bytes + b), _MM_HINT_T1);
  const int64_t code_bytes = NR * w.scale_row_stride;
  int64_t n = a.n0;
  for (; n + NR <= a.n1; n += NR) {
    // The scale codes are a stream of their own (NVFP4: one byte per 8 weight bytes, rows of 48-128 bytes
    // at Qwen3 shapes) that the weight prefetch does not cover and the hardware prefetcher follows late:
    // the tile after next's codes into L2 (NVFP4 experts +5 % per thread at AVX-512).
    if (n + 3 * NR <= a.n1)
      for (int64_t b = 0; b < code_bytes; b += 64)
        _mm_prefetch(reinterpret_cast<const char*>(codes + (n + 2 * NR) * w.scale_row_stride + b),
                     _MM_HINT_T1);
    tile.template operator()<NR>(data + n * w.row_bytes, codes + n * w.scale_row_stride, a.y + n, ahead);
  }
  for (; n < a.n1; ++n)
    tile.template operator()<1>(data + n * w.row_bytes, codes + n * w.scale_row_stride, a.y + n, int64_t{0});
}

}  // namespace
}  // namespace xmoe::kernels
