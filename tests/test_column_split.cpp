// split_columns (kernels/column_split.hpp): every unit runs exactly once, in the chunk counts its contract
// gives, for any team size; an exception thrown by a chunk reaches the caller after the team joins.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <stdexcept>
#include <utility>
#include <vector>

#include "kernels/column_split.hpp"

namespace xmoe::kernels {
namespace {

struct Calls {
  std::mutex mutex;
  std::vector<std::pair<int64_t, int64_t>> ranges;
};

std::vector<std::pair<int64_t, int64_t>> run(int threads, int64_t m, int64_t units, int64_t bytes) {
  Calls calls;
  split_columns(threads, m, units, bytes, [&](int64_t u0, int64_t u1) {
    const std::lock_guard lock(calls.mutex);
    calls.ranges.emplace_back(u0, u1);
  });
  std::sort(calls.ranges.begin(), calls.ranges.end());
  return calls.ranges;
}

TEST(ColumnSplit, EveryUnitOnceInTheContractsChunks) {
  const int64_t mib = int64_t(1) << 20;
  struct Case {
    int threads;
    int64_t m, units, bytes;
    size_t chunks;
  };
  const Case cases[] = {
      {2, 1, 1000, 600 * mib, 16},  // decode of a large weight: kChunksPerThread per thread at most
      {2, 1, 1000, 1 * mib, 4},     // 256 KiB per chunk
      {2, 4, 1000, 3 * mib, 12},    // 256 KiB per chunk at 4 rows too
      {2, 16, 1000, mib / 4, 2},    // at least one chunk per thread
      {3, 1, 1000, 600 * mib, 24}, {2, 1, 5, 600 * mib, 5},     // no more chunks than units
      {2, 17, 1000, 600 * mib, 2},                              // prefill: one share per thread
      {4, 512, 3, 600 * mib, 3},   {1, 1, 1000, 600 * mib, 1},  // one thread: one call
  };
  for (const Case& c : cases) {
    const auto ranges = run(c.threads, c.m, c.units, c.bytes);
    EXPECT_EQ(ranges.size(), c.chunks) << c.threads << " threads, m=" << c.m << ", " << c.units << " units";
    int64_t next = 0;
    for (const auto& [u0, u1] : ranges) {
      EXPECT_EQ(u0, next);
      EXPECT_GT(u1, u0);
      next = u1;
    }
    EXPECT_EQ(next, c.units);
  }
  EXPECT_TRUE(run(2, 1, 0, 0).empty());
}

TEST(ColumnSplit, AnExceptionReachesTheCallerAfterTheTeamJoins) {
  std::atomic<int> ran{0};
  EXPECT_THROW(split_columns(2, 1, 100, int64_t(64) << 20,
                             [&](int64_t u0, int64_t) {
                               ++ran;
                               if (u0 == 0) throw std::runtime_error("chunk 0");
                             }),
               std::runtime_error);
  EXPECT_EQ(ran.load(), 16);  // the other chunks still ran
}

}  // namespace
}  // namespace xmoe::kernels
