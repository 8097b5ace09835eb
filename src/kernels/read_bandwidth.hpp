// The machine's practical DRAM read bandwidth, measured in-process: the baseline against which decode's
// weight-streaming rate is reported (GB/s of weights read per decoded token / this).
#pragma once
#include <cstddef>
#include <cstdint>

#include "util/huge_buffer.hpp"

namespace xmoe::kernels {

// Streams a freshly allocated buffer of `bytes` (well above the last-level cache) with all OpenMP threads,
// each thread reading its own contiguous slice, `passes` times after one warm-up pass, by two read loops
// (hardware prefetch alone; a software prefetch a page ahead) alternated pass by pass. Returns the higher of
// the two loops' median pass rates in GB/s (1e9 bytes/s). Throws xmoe::Error when bytes < 64 MiB or
// passes < 1.
double measure_read_bandwidth_gbs(size_t bytes = size_t{1} << 30, int passes = 5);

// The same streaming read over memory the caller owns, e.g. a mapped checkpoint file (its page-cache pages
// and their page-table entries, rather than the probe's anonymous buffer): the higher median of the two
// loops' `passes` passes after one warm-up pass, in GB/s. thread_clock: passes timed by the calling thread's
// CPU time, for one OpenMP thread on a loaded machine (the time it streamed, not the time it waited for a
// core). Throws xmoe::Error when bytes < 64 MiB, passes < 1, data is null, or thread_clock with more than one
// thread.
double measure_read_bandwidth_gbs(const void* data, size_t bytes, int passes = 5, bool thread_clock = false);

// A probe to run between the steps of a run. On a shared host the read bandwidth moves between levels within
// seconds (on a 2-vCPU Zen 4 VM, 128 MiB passes read 29-33 GB/s for a few seconds, then 44-46, then 29
// again), so probes before and after a run of many seconds misjudge the steps in between: a step is compared
// with the probes right beside it instead. The buffer (`bytes`, at least 64 MiB, in 2 MiB pages) is allocated
// and first-touched once; each measure() reads it once with each of the two read loops and returns the higher
// rate in GB/s. Throws xmoe::Error when bytes < 64 MiB.
class ReadProbe {
 public:
  explicit ReadProbe(size_t bytes);
  double measure();
  size_t bytes() const { return words_ * sizeof(uint64_t); }

 private:
  HugeBuffer memory_;
  size_t words_;
};

// On a shared machine a probe or a decode run is only comparable with another when neither waited for a
// CPU. Seconds this process's threads have spent runnable but not running (the scheduler's run delay, summed
// over /proc/self/task/*/schedstat; threads that ended meanwhile drop out), or -1 where that cannot be read.
double process_runqueue_wait_seconds();
// Seconds of CPU time the hypervisor ran something else while this VM's CPUs wanted to run (steal, summed
// over CPUs from /proc/stat), or -1 where that cannot be read.
double machine_steal_seconds();

}  // namespace xmoe::kernels
