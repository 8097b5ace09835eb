// Splitting row ranges over OpenMP threads. Each row's arithmetic is done by one thread in a fixed order, so
// results do not depend on the thread count.
#pragma once
#include <omp.h>

#include <algorithm>
#include <cstdint>

namespace xmoe::moe {

// Calls fn(begin, end) on contiguous row chunks in parallel; chunks are at least min_rows long.
template <class Fn>
void parallel_rows(int64_t rows, int64_t min_rows, Fn&& fn) {
  if (rows <= 0) return;
  const int64_t max_chunks = std::max<int64_t>(1, rows / std::max<int64_t>(1, min_rows));
  const int64_t chunks = std::min<int64_t>(max_chunks, omp_get_max_threads());
  if (chunks <= 1 || omp_in_parallel()) {
    fn(int64_t{0}, rows);
    return;
  }
#pragma omp parallel for schedule(static) num_threads(static_cast <int>(chunks))
  for (int64_t c = 0; c < chunks; ++c) fn(rows * c / chunks, rows * (c + 1) / chunks);
}

// out[c] += Σ_r in[r, c] over rows (each column summed in row order), split over column blocks.
template <class In, class Acc, class Convert>
void column_sums(const In* in, int64_t rows, int64_t cols, Acc* out, Convert convert) {
  parallel_rows(cols, 256, [&](int64_t c0, int64_t c1) {
    for (int64_t r = 0; r < rows; ++r) {
      const In* row = in + r * cols;
      for (int64_t c = c0; c < c1; ++c) out[c] += convert(row[c]);
    }
  });
}

}  // namespace xmoe::moe
