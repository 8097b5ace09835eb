#include "kernels/column_split.hpp"

#include <algorithm>
#include <exception>

namespace xmoe::kernels {

void split_columns(int threads, int64_t m, int64_t units, int64_t bytes,
                   const std::function<void(int64_t, int64_t)>& body) {
  if (threads <= 1 || units <= 1) {
    if (units > 0) body(0, units);
    return;
  }
  const int64_t chunks =
      std::min(units, m <= kDynamicRowsMax
                          ? std::clamp<int64_t>(bytes / kChunkBytes, threads, threads * kChunksPerThread)
                          : int64_t(threads));
  // An exception cannot leave a parallel region: the first one is kept and rethrown after it.
  std::exception_ptr failure;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t c = 0; c < chunks; ++c) {
    try {
      body(units * c / chunks, units * (c + 1) / chunks);
    } catch (...) {
#pragma omp critical(split_columns_failure)
      if (!failure) failure = std::current_exception();
    }
  }
  if (failure) std::rethrow_exception(failure);
}

}  // namespace xmoe::kernels
