#include "kernels/read_bandwidth.hpp"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "util/clock.hpp"
#include "util/huge_buffer.hpp"
#include "xmoe/error.hpp"

namespace xmoe::kernels {
namespace {

// Eight independent accumulators keep enough loads in flight; the sum is returned so the reads are not dead.
// `ahead` words: each line is also requested that far ahead (0: none). Which is faster depends on the
// machine: on Zen 4 the hardware prefetchers alone stream one sequential read ~20 % faster than with a
// software prefetch a page ahead (the decode kernels, reading 4 weight rows and their scales at once, need
// theirs), so the probe times both and keeps the faster: it is meant to show the best rate a streaming read
// reaches, not one loop's.
uint64_t read_slice(const uint64_t* p, size_t n, size_t ahead) {
  uint64_t acc[8] = {};
  size_t i = 0;
  if (ahead == 0) {
    for (; i + 8 <= n; i += 8)
      for (int j = 0; j < 8; ++j) acc[j] += p[i + j];
  } else {
    for (; i + 8 <= n; i += 8) {
      if (i + ahead < n) __builtin_prefetch(p + i + ahead, 0, 2);
      for (int j = 0; j < 8; ++j) acc[j] += p[i + j];
    }
  }
  for (; i < n; ++i) acc[0] += p[i];
  uint64_t s = 0;
  for (uint64_t a : acc) s += a;
  return s;
}

// One pass of read loop `loop` (0: hardware prefetch alone; 1: a software prefetch a page ahead) over n words
// at p, each of the OpenMP threads reading its own contiguous slice; seconds on the chosen clock, from when
// every thread has started (a thread woken on an idle vCPU can take a millisecond or more to start, which a
// short pass would count as a slow read). sum: what the reads added up, so they are not dead.
double timed_pass(const uint64_t* p, size_t n, int loop, bool thread_clock, uint64_t& sum) {
  const auto now = [thread_clock] {
    return thread_clock ? cpu_seconds(CLOCK_THREAD_CPUTIME_ID) : wall_seconds();
  };
  constexpr size_t kAhead[2] = {0, 4096 / sizeof(uint64_t)};
  const int threads = omp_get_max_threads();
  uint64_t total = 0;
  double t0 = 0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
  {
#pragma omp barrier
#pragma omp master
    t0 = now();
    const size_t t = static_cast<size_t>(omp_get_thread_num()),
                 nt = static_cast<size_t>(omp_get_num_threads());
    const size_t b = n * t / nt, e = n * (t + 1) / nt;
    total += read_slice(p + b, e - b, kAhead[loop]);
  }
  const double s = now() - t0;
  sum += total;
  return s;
}

// The higher of two medians of `passes` timed passes each (after a warm-up pass) over n words at p: one read
// loop without and one with the software prefetch, alternated pass by pass so that a drift of the machine's
// bandwidth hits both alike.
double median_pass_rate(const uint64_t* p, size_t n, int passes, bool thread_clock) {
  std::vector<double> rates[2];
  volatile uint64_t sink = 0;
  for (int pass = 0; pass <= passes; ++pass) {
    for (int loop = 0; loop < 2; ++loop) {
      uint64_t total = 0;
      const double s = timed_pass(p, n, loop, thread_clock, total);
      sink = sink + total;
      if (pass > 0) rates[loop].push_back(static_cast<double>(n * sizeof(uint64_t)) / s / 1e9);
    }
  }
  double best = 0;
  for (std::vector<double>& r : rates) {
    std::sort(r.begin(), r.end());
    best = std::max(best, r[r.size() / 2]);
  }
  return best;
}

// A fresh buffer of `words` in 2 MiB pages (as the checkpoint's weights are read, io/page_cache.hpp: a
// baseline below what the weights reach would overstate every share of it), first touched by the reading
// threads so pages sit where (and as) they will be read.
HugeBuffer touched_buffer(size_t words) {
  HugeBuffer memory = allocate_huge_buffer(words * sizeof(uint64_t));
  auto* buf = reinterpret_cast<uint64_t*>(memory.get());
  const int threads = omp_get_max_threads();
#pragma omp parallel num_threads(threads)
  {
    const size_t t = static_cast<size_t>(omp_get_thread_num()),
                 nt = static_cast<size_t>(omp_get_num_threads());
    for (size_t i = words * t / nt; i < words * (t + 1) / nt; ++i) buf[i] = i;
  }
  return memory;
}

void check_probe_args(size_t bytes, int passes, const char* what = "measure_read_bandwidth_gbs") {
  XMOE_CHECK(bytes >= (size_t{64} << 20), what, ": bytes must be at least 64 MiB, got ", bytes);
  XMOE_CHECK(passes >= 1, what, ": passes must be at least 1, got ", passes);
}

}  // namespace

double measure_read_bandwidth_gbs(size_t bytes, int passes) {
  check_probe_args(bytes, passes);
  const size_t n = bytes / sizeof(uint64_t);
  const HugeBuffer memory = touched_buffer(n);
  return median_pass_rate(reinterpret_cast<const uint64_t*>(memory.get()), n, passes, false);
}

ReadProbe::ReadProbe(size_t bytes) : words_(bytes / sizeof(uint64_t)) {
  check_probe_args(bytes, 1, "ReadProbe");
  memory_ = touched_buffer(words_);
}

double ReadProbe::measure() {
  const auto* p = reinterpret_cast<const uint64_t*>(memory_.get());
  double best = 0;
  volatile uint64_t sink = 0;
  for (int loop = 0; loop < 2; ++loop) {
    uint64_t total = 0;
    const double s = timed_pass(p, words_, loop, false, total);
    sink = sink + total;
    best = std::max(best, static_cast<double>(words_ * sizeof(uint64_t)) / s / 1e9);
  }
  return best;
}

double measure_read_bandwidth_gbs(const void* data, size_t bytes, int passes, bool thread_clock) {
  check_probe_args(bytes, passes);
  XMOE_CHECK(data != nullptr, "measure_read_bandwidth_gbs: data is null");
  XMOE_CHECK(!thread_clock || omp_get_max_threads() == 1,
             "measure_read_bandwidth_gbs: the thread clock times one thread, not ", omp_get_max_threads());
  // Words from the first 8-byte boundary on (a mapped tensor need not be aligned).
  const auto addr = reinterpret_cast<uintptr_t>(data);
  const size_t skip = (8 - addr % 8) % 8;
  return median_pass_rate(reinterpret_cast<const uint64_t*>(addr + skip), (bytes - skip) / sizeof(uint64_t),
                          passes, thread_clock);
}

double process_runqueue_wait_seconds() {
  std::error_code ec;
  std::filesystem::directory_iterator tasks("/proc/self/task", ec);
  if (ec) return -1;
  double ns = 0;
  for (const std::filesystem::directory_entry& task : tasks) {
    std::ifstream in(task.path() / "schedstat");
    double running = 0, waiting = 0;
    if (in >> running >> waiting) ns += waiting;
  }
  return ns * 1e-9;
}

double machine_steal_seconds() {
  std::ifstream in("/proc/stat");
  std::string cpu;
  // user nice system idle iowait irq softirq steal, in clock ticks
  double field[8];
  if (!(in >> cpu) || cpu != "cpu") return -1;
  for (double& f : field)
    if (!(in >> f)) return -1;
  const long hz = ::sysconf(_SC_CLK_TCK);
  return hz > 0 ? field[7] / static_cast<double>(hz) : -1;
}

}  // namespace xmoe::kernels
