// The machine's practical DRAM read bandwidth, measured in-process: the baseline against which decode's
// weight-streaming rate is reported (GB/s of weights read per decoded token / this).
#pragma once
#include <cstddef>

namespace xmoe::kernels {

// Streams a freshly allocated buffer of `bytes` (well above the last-level cache) with all OpenMP threads,
// each thread reading its own contiguous slice, `passes` times after one warm-up pass. Returns the median
// pass rate in GB/s (1e9 bytes/s). Throws xmoe::Error when bytes < 64 MiB or passes < 1.
double measure_read_bandwidth_gbs(size_t bytes = size_t{1} << 30, int passes = 5);

}  // namespace xmoe::kernels
