// The decode kernels' software prefetch of the weight rows ahead: each register-tile step asks for its own
// slice of the next rows, so the whole slice arrives in L2 by the tile's last step (the hardware prefetchers
// stop at 4 KiB pages).
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

namespace xmoe::kernels {

// Lines [at, at + bytes) of next, cut at next_bytes, into L2.
inline void prefetch_slice(const char* next, int64_t at, int64_t bytes, int64_t next_bytes) {
  for (int64_t b = at; b < std::min(at + bytes, next_bytes); b += 64) _mm_prefetch(next + b, _MM_HINT_T1);
}

}  // namespace xmoe::kernels
