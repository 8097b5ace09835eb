// app/step_bandwidth: `xmoe generate --measure-bandwidth`'s decode steps against the read probes beside them.
#include <gtest/gtest.h>

#include <vector>

#include "step_bandwidth.hpp"

namespace xmoe::app {
namespace {

TEST(StepBandwidth, ShareIsRooflineTimeOverStepTime) {
  // 1 GB in 50 ms beside a 40 GB/s probe: 25 ms at the probe, half the step; 1 GB in 25 ms beside 50 GB/s:
  // 20 ms, 80 %. Together: 45 ms of roofline in 75 ms of steps.
  const StepBandwidth s = summarize_steps({{1e9, 0.050, 40.0}, {1e9, 0.025, 50.0}});
  EXPECT_EQ(s.steps, 2);
  EXPECT_DOUBLE_EQ(s.share, 0.045 / 0.075);
  EXPECT_DOUBLE_EQ(s.share_median, 0.5 * (0.5 + 0.8));
  EXPECT_DOUBLE_EQ(s.share_low, 0.5);
  EXPECT_DOUBLE_EQ(s.share_high, 0.8);
  EXPECT_DOUBLE_EQ(s.probe_min, 40.0);
  EXPECT_DOUBLE_EQ(s.probe_max, 50.0);
  EXPECT_DOUBLE_EQ(s.probe_median, 45.0);
}

TEST(StepBandwidth, ASlowStepCountsByItsTimeNotAsOneOfMany) {
  // Nine steps at the roofline and one ten times slower: the median step is at 100 %, the run at 10 / 19.
  std::vector<DecodeStepSample> steps(9, {1e9, 0.025, 40.0});
  steps.push_back({1e9, 0.25, 40.0});
  const StepBandwidth s = summarize_steps(steps);
  EXPECT_EQ(s.steps, 10);
  EXPECT_NEAR(s.share, 10 * 0.025 / (9 * 0.025 + 0.25), 1e-12);
  EXPECT_NEAR(s.share_median, 1.0, 1e-12);
  EXPECT_NEAR(s.share_low, 1.0, 1e-12);
}

TEST(StepBandwidth, StepsWithoutTimeOrProbeAreLeftOut) {
  EXPECT_EQ(summarize_steps({}).steps, 0);
  EXPECT_EQ(summarize_steps({}).share, 0.0);
  const StepBandwidth s = summarize_steps({{1e9, 0.0, 40.0}, {1e9, 0.05, 0.0}, {1e9, 0.05, 40.0}});
  EXPECT_EQ(s.steps, 1);
  EXPECT_DOUBLE_EQ(s.share, 0.5);
}

}  // namespace
}  // namespace xmoe::app
