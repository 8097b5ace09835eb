// The linear kernels' software prefetch of the weight rows ahead into L2 (the hardware prefetchers stop at 4
// KiB pages): in decode each register-tile step asks for its own slice of the next rows, so the whole slice
// arrives by the tile's last step; where several tiles share the rows (batched decode, prefill panels), the
// next rows' lines are spread evenly over all of them.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

namespace xmoe::kernels {

// Lines [at, at + bytes) of next, cut at next_bytes, into L2.
inline void prefetch_slice(const char* next, int64_t at, int64_t bytes, int64_t next_bytes) {
  for (int64_t b = at; b < std::min(at + bytes, next_bytes); b += 64) _mm_prefetch(next + b, _MM_HINT_T1);
}

// The lines of [next, next + bytes) into L2 spread evenly over `steps` calls of step(): call s asks for lines
// [lines · s / steps, lines · (s + 1) / steps), fewer than one a call where the tile is long. For tiles that
// share a group of weight rows, where a fixed slice per step would ask for their share in a burst: on Intel
// an L2 prefetch holds one of the core's ~16 L1 fill buffers until DRAM answers, so a burst stalls the tile's
// own x loads from L2 behind it.
class PrefetchEvenly {
 public:
  PrefetchEvenly(const char* next, int64_t bytes, int64_t steps)
      : next_(next), lines_(next == nullptr ? 0 : (bytes + 63) / 64), steps_(std::max<int64_t>(steps, 1)) {}
  void step() {
    for (owed_ += lines_; owed_ >= steps_; owed_ -= steps_, next_ += 64) _mm_prefetch(next_, _MM_HINT_T1);
  }

 private:
  const char* next_;
  int64_t lines_, steps_, owed_ = 0;
};

// Bytes of weights in memory, for a prefetch.
struct WeightSpan {
  const char* data = nullptr;
  int64_t bytes = 0;
};

// Part `part` of `parts` equal parts of [next, next + bytes): what each of the tiles (or passes) that share a
// group of weight rows prefetches of the next group.
inline WeightSpan share_of(const char* next, int64_t bytes, int64_t part, int64_t parts) {
  const int64_t share = (bytes + parts - 1) / parts, at = part * share;
  const int64_t size = std::clamp<int64_t>(bytes - at, 0, share);
  return size > 0 ? WeightSpan{next + at, size} : WeightSpan{};
}

// Weight rows [j, j + rows) of a matrix whose rows start row_bytes apart and hold used_bytes each.
inline WeightSpan rows_span(const void* data, int64_t row_bytes, int64_t used_bytes, int64_t j,
                            int64_t rows) {
  return {static_cast<const char*>(data) + j * row_bytes, (rows - 1) * row_bytes + used_bytes};
}

// For the panel GEMMs (linear_panels_*.hpp), which walk columns [n0, n1) in panels of `rows` weight rows,
// once per chunk of x rows: the weights of the panel after the one at j (after the last, the next chunk's
// first when there is one), where the packer names its rows' span (`pack.span(j, rows)`); none otherwise.
template <class Packer>
WeightSpan next_panel_span(const Packer& pack, int64_t j, int64_t rows, int64_t n0, int64_t n1,
                           bool another_chunk) {
  if constexpr (requires { pack.span(j, 1); }) {
    const int64_t next = j + rows < n1 ? j + rows : (another_chunk ? n0 : n1);
    if (next < n1) return pack.span(next, static_cast<int>(std::min(rows, n1 - next)));
  }
  return {};
}

}  // namespace xmoe::kernels
