// Operands for the BF16 linears' bit-exact tests (test_linear_bf16dot.cpp, test_linear_bf16tile.cpp): a bf16
// weight view with NaN-filled gaps, activations and weights that exercise denormals, signed zeros and
// rounding ties, and a runner that fills y with a sentinel first.
#pragma once
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/kernels.hpp"
#include "kernels/linear.hpp"
#include "xmoe/dtype.hpp"
#include "xmoe/safetensors.hpp"

namespace xmoe::kernels::test {

// A [n, k] bf16 weight (bits given) with rows `stride` elements apart; gaps hold NaN bits.
struct Bf16Weight {
  std::vector<uint16_t> bits;
  PackedWeight w;
  Bf16Weight(const std::vector<uint16_t>& v, int64_t n, int64_t k, int64_t stride)
      : bits(static_cast<size_t>(n * stride), 0x7fc1) {
    for (int64_t r = 0; r < n; ++r) std::copy_n(v.begin() + r * k, k, bits.begin() + r * stride);
    w.format = WeightFormat::bf16;
    w.rows = n;
    w.cols = k;
    w.data = reinterpret_cast<const std::byte*>(bits.data());
    w.row_bytes = stride * 2;
  }
};

inline uint16_t bits_of(float f) {
  return bf16::from_float(f);
}

// Values over a wide exponent range (so sums cancel and round), with denormal f32 activations, bf16 denormal
// weights, signed zeros and exact bf16 rounding ties mixed in.
inline float tricky_x(std::mt19937& rng) {
  std::uniform_int_distribution<int> kind(0, 19), ex(-30, 30);
  std::normal_distribution<float> nd;
  switch (kind(rng)) {
    case 0:
      return 1e-39f * (nd(rng) > 0 ? 1 : -1);  // f32 denormal: bf16 denormal after rounding
    case 1:
      return -0.0f;
    case 2:
      return 1.0f + 0x1p-8f;  // a tie: rounds to even (1.0)
    default:
      return std::ldexp(nd(rng), ex(rng));
  }
}
inline uint16_t tricky_w(std::mt19937& rng) {
  std::uniform_int_distribution<int> kind(0, 19), ex(-30, 30);
  std::uniform_int_distribution<int> mant(1, 127);
  std::normal_distribution<float> nd;
  switch (kind(rng)) {
    case 0:
      return static_cast<uint16_t>(mant(rng));  // bf16 denormal
    case 1:
      return 0x8000;  // -0
    default:
      return bits_of(std::ldexp(nd(rng), ex(rng)));
  }
}

inline std::vector<float> run(LinearFn fn, const PackedWeight& w, const std::vector<float>& x, int64_t m,
                              int64_t ldx, int64_t n0, int64_t n1) {
  std::vector<float> y(static_cast<size_t>(m * w.rows), -7.0f);
  fn({x.data(), m, ldx, &w, n0, n1, y.data(), w.rows});
  return y;
}
// The table's BF16 linear.
inline std::vector<float> run(const KernelTable& t, const PackedWeight& w, const std::vector<float>& x,
                              int64_t m, int64_t ldx, int64_t n0, int64_t n1) {
  return run(t.linear[size_t(WeightFormat::bf16)], w, x, m, ldx, n0, n1);
}

inline bool same_bits(float a, float b) {
  return std::memcmp(&a, &b, 4) == 0;
}

// One random case of `fast` against `ref`, bit for bit: an [n, k] weight with rows k + 5 apart for odd n, x
// rows k + 3 apart with NaN gaps (never read), outputs [n0, n).
inline void expect_same_bits_on_random_case(LinearFn fast, LinearFn ref, int64_t m, int64_t k, int64_t n,
                                            int64_t n0, std::mt19937& rng) {
  const int64_t stride = k + (n % 2) * 5, ldx = k + 3;
  std::vector<uint16_t> v(static_cast<size_t>(n * k));
  for (uint16_t& e : v) e = tricky_w(rng);
  std::vector<float> x(static_cast<size_t>(m * ldx), std::nanf(""));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t p = 0; p < k; ++p) x[static_cast<size_t>(i * ldx + p)] = tricky_x(rng);
  const Bf16Weight tw(v, n, k, stride);
  const std::vector<float> a = run(fast, tw.w, x, m, ldx, n0, n), b = run(ref, tw.w, x, m, ldx, n0, n);
  for (size_t e = 0; e < a.size(); ++e)
    ASSERT_TRUE(same_bits(a[e], b[e]))
        << "m=" << m << " k=" << k << " n=" << n << " output " << e << ": " << a[e] << " vs " << b[e];
}

// Each (name, kernel) against PyTorch's float64 product of the bf16-rounded operands
// (tools/make_bf16dot_fixture.py's fixture): every output within (roundings_per_step · steps +
// more_roundings) · 2^-24 · Σ|x̂ ŵ| (1 % slack), the f32 error bound of a summation path with that many
// roundings.
inline void expect_within_f32_bound_of_pytorch(const std::vector<std::pair<std::string, LinearFn>>& kernels,
                                               int64_t roundings_per_step, int64_t more_roundings) {
  const SafetensorsFile f =
      SafetensorsFile::open(std::string(XMOE_TEST_DATA_DIR) + "/linear_bf16dot/case.safetensors");
  const Tensor xt = f.tensor("x");
  const int64_t m = xt.dim(0), k = xt.dim(1);
  const auto wbytes = f.bytes("w");
  const int64_t n = static_cast<int64_t>(wbytes.size()) / 2 / k;
  std::vector<uint16_t> v(static_cast<size_t>(n * k));
  std::memcpy(v.data(), wbytes.data(), wbytes.size());
  const std::vector<float> x(xt.data<float>(), xt.data<float>() + m * k);
  const Tensor y64 = f.tensor("y64"), mag = f.tensor("abs_sum");
  const Bf16Weight tw(v, n, k, k);
  const int64_t steps = (k + 31) / 32;
  const double u = 0x1p-24 * static_cast<double>(roundings_per_step * steps + more_roundings) * 1.01;
  for (const auto& [name, fn] : kernels) {
    const std::vector<float> y = run(fn, tw.w, x, m, k, 0, n);
    double worst = 0;
    for (int64_t e = 0; e < m * n; ++e) {
      const double err = std::abs(y[e] - y64.data<double>()[e]), bound = u * mag.data<double>()[e];
      ASSERT_LE(err, bound) << name << " output " << e;
      worst = std::max(worst, err / bound);
    }
    std::printf("%s: largest error / bound %.3g\n", name.c_str(), worst);
  }
}

// A row's outputs through `table`'s linear_forward are the same bits alone (1 thread), inside 200 rows (3
// threads) and inside a batch of 16.
inline void expect_rows_independent_of_batch_and_threads(const KernelTable& table) {
  std::mt19937 rng(5);
  const int64_t k = 300, n = 517, m = 200;
  std::vector<uint16_t> v(static_cast<size_t>(n * k));
  std::vector<float> x(static_cast<size_t>(m * k));
  for (uint16_t& e : v) e = tricky_w(rng);
  for (float& e : x) e = tricky_x(rng);
  const Bf16Weight tw(v, n, k, k);
  std::vector<float> all(static_cast<size_t>(m * n)), one(static_cast<size_t>(n)), few(16 * one.size());
  const int saved = omp_get_max_threads();
  omp_set_num_threads(3);
  linear_forward(table, tw.w, x.data(), m, all.data());
  linear_forward(table, tw.w, x.data() + 5 * k, 16, few.data());
  omp_set_num_threads(1);
  for (int64_t i = 0; i < m; ++i) {
    linear_forward(table, tw.w, x.data() + i * k, 1, one.data());
    ASSERT_TRUE(std::equal(one.begin(), one.end(), all.begin() + i * n, same_bits)) << "row " << i;
    if (i >= 5 && i < 5 + 16) {
      ASSERT_TRUE(std::equal(one.begin(), one.end(), few.begin() + (i - 5) * n, same_bits))
          << "row " << i << " in a batch of 16";
    }
  }
  omp_set_num_threads(saved);
}

}  // namespace xmoe::kernels::test
