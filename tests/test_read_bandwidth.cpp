// The read-bandwidth probe that `xmoe generate --measure-bandwidth` reports decode against.
#include <gtest/gtest.h>
#include <omp.h>

#include <chrono>
#include <cmath>
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

}  // namespace
}  // namespace xmoe
