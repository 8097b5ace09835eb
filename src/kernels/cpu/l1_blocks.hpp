// How a few-row kernel cuts k when its x rows would outgrow L1: equal blocks, each tile's chains carried
// from block to block (so the bits do not depend on the cut). Shared by the AVX2 BF16 pair tiles (units:
// 16-column steps) and the AVX2 FP4 byte-lookup groups (units: columns).
#pragma once
#include <algorithm>
#include <cstdint>

namespace xmoe::kernels {

// Units per block: all `units` when units · unit_bytes ≤ whole_bytes, else as many equal blocks as keep
// each within block_bytes, rounded up to a multiple of `align` units.
inline int64_t units_per_block(int64_t units, int64_t unit_bytes, int64_t whole_bytes, int64_t block_bytes,
                               int64_t align = 1) {
  const int64_t bytes = units * unit_bytes;
  if (bytes <= whole_bytes) return units;
  const int64_t blocks = (bytes + block_bytes - 1) / block_bytes;
  return std::min(units, ((units + blocks - 1) / blocks + align - 1) / align * align);
}

}  // namespace xmoe::kernels
