// The read-bandwidth probe that `xmoe generate --measure-bandwidth` reports decode against.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "kernels/read_bandwidth.hpp"
#include "xmoe/error.hpp"

namespace xmoe {
namespace {

TEST(ReadBandwidth, RateIsBytesPerPassTime) {
  // The median pass fits inside the whole call, so its rate is at least bytes / elapsed; and no machine reads
  // 64 MiB from DRAM at 10 TB/s, which catches a rate off by a unit.
  const size_t bytes = size_t{64} << 20;
  const auto t0 = std::chrono::steady_clock::now();
  const double gbs = kernels::measure_read_bandwidth_gbs(bytes, 3);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(std::isfinite(gbs));
  EXPECT_GE(gbs, static_cast<double>(bytes) / s / 1e9);
  EXPECT_LT(gbs, 10000.0);
}

TEST(ReadBandwidth, RejectsSmallBuffersAndNoPasses) {
  EXPECT_THROW(kernels::measure_read_bandwidth_gbs(size_t{1} << 20, 1), Error);
  EXPECT_THROW(kernels::measure_read_bandwidth_gbs(size_t{64} << 20, 0), Error);
}

TEST(ReadBandwidth, ProbeBetweenStepsRateIsBytesPerPassTime) {
  // Each measure() is two passes over the probe's buffer; the faster fits inside the call.
  const size_t bytes = size_t{64} << 20;
  kernels::ReadProbe probe(bytes);
  EXPECT_EQ(probe.bytes(), bytes);
  for (int i = 0; i < 2; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    const double gbs = probe.measure();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_TRUE(std::isfinite(gbs));
    EXPECT_GE(gbs, static_cast<double>(bytes) / s / 1e9);
    EXPECT_LT(gbs, 10000.0);
  }
  try {
    kernels::ReadProbe small(size_t{1} << 20);
    ADD_FAILURE() << "a 1 MiB probe was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ReadProbe: bytes must be at least 64 MiB"), std::string::npos)
        << e.what();
  }
}

TEST(ReadBandwidth, CallersMemoryRateIsBytesPerPassTime) {
  // Over memory the caller owns (generate and linear-bench pass a mapped checkpoint tensor), starting off an
  // 8-byte boundary as a tensor in a safetensors file may.
  const size_t bytes = size_t{64} << 20;
  std::vector<unsigned char> buf(bytes + 8, 1);
  const auto t0 = std::chrono::steady_clock::now();
  const double gbs = kernels::measure_read_bandwidth_gbs(buf.data() + 3, bytes, 3);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(std::isfinite(gbs));
  EXPECT_GE(gbs, static_cast<double>(bytes - 8) / s / 1e9);
  EXPECT_LT(gbs, 10000.0);
  EXPECT_THROW(kernels::measure_read_bandwidth_gbs(buf.data(), size_t{1} << 20, 1), Error);
  EXPECT_THROW(kernels::measure_read_bandwidth_gbs(buf.data(), bytes, 0), Error);
  EXPECT_THROW(kernels::measure_read_bandwidth_gbs(nullptr, bytes, 1), Error);
}

TEST(ReadBandwidth, ThreadClockTimesOneThread) {
  // The thread's CPU time of a pass is at most its wall time, so the rate is still at least bytes / elapsed.
  const size_t bytes = size_t{64} << 20;
  std::vector<unsigned char> buf(bytes, 1);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const auto t0 = std::chrono::steady_clock::now();
  const double gbs = kernels::measure_read_bandwidth_gbs(buf.data(), bytes, 2, true);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(gbs, static_cast<double>(bytes) / s / 1e9);
  EXPECT_LT(gbs, 10000.0);
  // Other threads' time is not on the calling thread's clock.
  omp_set_num_threads(2);
  EXPECT_THROW(kernels::measure_read_bandwidth_gbs(buf.data(), bytes, 1, true), Error);
  omp_set_num_threads(saved);
}

TEST(ReadBandwidth, RunQueueWaitGrowsWhenThreadsOutnumberCpus) {
  // More busy threads than CPUs must wait for one in turn: the process's summed run delay grows by a good
  // part of the time they spin (each of n threads on c < n CPUs waits about (n - c) / n of it).
  const double before = kernels::process_runqueue_wait_seconds();
  if (before < 0) GTEST_SKIP() << "no /proc/self/task/*/schedstat";
  const unsigned cpus = std::max(1u, std::thread::hardware_concurrency());
  const auto spin_until = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
  std::vector<std::thread> threads;
  for (unsigned i = 0; i < 2 * cpus; ++i)
    threads.emplace_back([spin_until] {
      volatile uint64_t n = 0;
      while (std::chrono::steady_clock::now() < spin_until) n = n + 1;
    });
  // Read while they are alive: a thread that ended drops out of /proc/self/task.
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  const double during = kernels::process_runqueue_wait_seconds();
  for (std::thread& t : threads) t.join();
  EXPECT_GT(during - before, 0.02);
  EXPECT_LT(during - before, 2 * cpus * 0.2 + 1.0);  // not off by a unit (ns read as ms, ...)
  const double steal0 = kernels::machine_steal_seconds(), steal1 = kernels::machine_steal_seconds();
  if (steal0 >= 0) {
    EXPECT_GE(steal1, steal0);
  }
}

}  // namespace
}  // namespace xmoe
