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

// A 19 × 272 FP8 weight (f32 or, ue8m0, power-of-two multipliers) whose row 9 holds a NaN code, a view of it
// with flags of its own, and `kernel` / the reference over it at m x rows.
class NanFlagCase {
 public:
  static constexpr int64_t n = 19, k = 272;
  NanFlagCase(bool ue8m0, unsigned seed) : flags(n), rng_(seed) {
    std::vector<float> values(n * k);
    for (float& v : values) v = 0.05f * normal_(rng_);
    fp8_ = kernels::quant::quantize_fp8_block(values.data(), n, k, ue8m0);
    fp8_.data[9 * k + 100] = 0x7F;
    w = fp8_.view();
    w.nan_free_rows = flags.data();
  }
  // y of `kernel` over `w` and the reference's over the bare view, for the same random x of m rows.
  std::pair<std::vector<float>, std::vector<float>> run(kernels::LinearFn kernel, kernels::LinearFn reference,
                                                        int64_t m) {
    std::vector<float> x(static_cast<size_t>(m * k));
    for (float& v : x) v = normal_(rng_);
    const auto call = [&](kernels::LinearFn f, const kernels::PackedWeight& weight) {
      std::vector<float> y(static_cast<size_t>(m * n));
      f(kernels::LinearArgs{x.data(), m, k, &weight, 0, n, y.data(), n});
      return y;
    };
    return {call(kernel, w), call(reference, fp8_.view())};
  }

  std::vector<std::atomic<uint8_t>> flags;
  kernels::PackedWeight w;  // the weight's view with `flags`

 private:
  std::mt19937 rng_;
  std::normal_distribution<float> normal_{0.0f, 1.0f};
  kernels::quant::QuantizedMatrix fp8_;
};

inline void expect_same_bits(const std::vector<float>& got, const std::vector<float>& want,
                             const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(same_float(got[i], want[i])) << what << ", at " << i;
}

// `kernel` at m x rows (a decode shape): the first call (rows checked) and the second (the rows found clean
// flagged, so left unchecked) give `reference`'s bits; row 9, and with it the rest of its tile, stays
// unflagged while rows 0 and 18 get flagged; and with every flag set by hand the NaN code is decoded as a
// number (a flag is taken at its word).
inline void expect_nan_free_row_flags(kernels::LinearFn kernel, kernels::LinearFn reference, bool ue8m0,
                                      int64_t m, const std::string& what) {
  NanFlagCase c(ue8m0, static_cast<unsigned>(19 + m + (ue8m0 ? 7 : 0)));
  auto [got, want] = c.run(kernel, reference, m);
  expect_same_bits(got, want, what + ", first call");
  EXPECT_EQ(c.flags[9], 0) << what;
  EXPECT_EQ(c.flags[0], 1) << what;
  EXPECT_EQ(c.flags[18], 1) << what;
  std::tie(got, want) = c.run(kernel, reference, m);
  expect_same_bits(got, want, what + ", with rows flagged");
  for (auto& f : c.flags) f = 1;
  const std::vector<float> trusted = c.run(kernel, reference, m).first;
  for (int64_t i = 0; i < m; ++i) EXPECT_FALSE(std::isnan(trusted[i * NanFlagCase::n + 9])) << what;
}

// `kernel` at m_panels x rows (a prefill shape, decoding panels of weight rows once) flags the clean rows
// it decoded whole, not the NaN row; a decode call after it (one x row) still gives the reference's bits.
inline void expect_panels_flag_clean_rows(kernels::LinearFn kernel, kernels::LinearFn reference,
                                          int64_t m_panels, const std::string& what) {
  NanFlagCase c(false, static_cast<unsigned>(31 + m_panels));
  auto [got, want] = c.run(kernel, reference, m_panels);
  expect_same_bits(got, want, what + ", panels");
  EXPECT_EQ(c.flags[9], 0) << what;
  EXPECT_EQ(c.flags[0], 1) << what;
  EXPECT_EQ(c.flags[18], 1) << what;
  std::tie(got, want) = c.run(kernel, reference, 1);
  expect_same_bits(got, want, what + ", decode after the panels");
}

}  // namespace xmoe::test
