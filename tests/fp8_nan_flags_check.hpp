// The contract of PackedWeight::nan_free_rows, checked for one FP8 kernel: by test_quant_linear.cpp at the
// `highest` levels and test_quant_medium.cpp for the AVX512-BF16 `medium` forms.
#pragma once
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kernels/packed_weight.hpp"
#include "kernels/quant/quantize.hpp"
#include "quant_fixture.hpp"

namespace xmoe::test {

// `kernel` at m x rows (a decode shape) over a 19 × 272 FP8 weight (f32 or, ue8m0, power-of-two multipliers)
// whose row 9 holds a NaN code: the first call (rows checked) and the second (the rows found clean flagged,
// so left unchecked) give `reference`'s bits; row 9, and with it the rest of its tile, stays unflagged while
// rows 0 and 18 get flagged; and with every flag set by hand the NaN code is decoded as a number (a flag is
// taken at its word).
inline void expect_nan_free_row_flags(kernels::LinearFn kernel, kernels::LinearFn reference, bool ue8m0,
                                      int64_t m, const std::string& what) {
  using kernels::LinearArgs;
  using kernels::PackedWeight;
  constexpr int64_t n = 19, k = 272;
  std::mt19937 rng(static_cast<unsigned>(19 + m + (ue8m0 ? 7 : 0)));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(n * k), x(static_cast<size_t>(m * k));
  for (float& v : values) v = 0.05f * normal(rng);
  for (float& v : x) v = normal(rng);
  auto fp8 = kernels::quant::quantize_fp8_block(values.data(), n, k, ue8m0);
  fp8.data[9 * k + 100] = 0x7F;
  std::vector<std::atomic<uint8_t>> flags(n);
  PackedWeight w = fp8.view();
  w.nan_free_rows = flags.data();
  const auto run = [&](kernels::LinearFn f, const PackedWeight& weight) {
    std::vector<float> y(static_cast<size_t>(m * n));
    f(LinearArgs{x.data(), m, k, &weight, 0, n, y.data(), n});
    return y;
  };
  const std::vector<float> want = run(reference, fp8.view());
  const auto expect_reference = [&](const std::vector<float>& got, const std::string& call) {
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_TRUE(same_float(got[i], want[i])) << what << ", " << call << ", at " << i;
  };
  expect_reference(run(kernel, w), "first call");
  EXPECT_EQ(flags[9], 0) << what;
  EXPECT_EQ(flags[0], 1) << what;
  EXPECT_EQ(flags[18], 1) << what;
  expect_reference(run(kernel, w), "with rows flagged");
  for (auto& f : flags) f = 1;
  const std::vector<float> trusted = run(kernel, w);
  for (int64_t i = 0; i < m; ++i) EXPECT_FALSE(std::isnan(trusted[i * n + 9])) << what;
}

}  // namespace xmoe::test
