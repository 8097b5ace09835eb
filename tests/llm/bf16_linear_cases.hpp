// Operands for the BF16 linears' bit-exact tests (test_linear_bf16dot.cpp, test_linear_bf16tile.cpp): a bf16
// weight view with NaN-filled gaps, activations and weights that exercise denormals, signed zeros and
// rounding ties, and a runner that fills y with a sentinel first.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/kernels.hpp"
#include "xmoe/dtype.hpp"

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

}  // namespace xmoe::kernels::test
