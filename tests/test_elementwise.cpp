// Element-wise kernels: every vector variant against the scalar reference, and the reference and the vector
// math helpers against libm. Tolerances (relative to the reference value, plus a floor where stated):
//  * exact ops (identity, relu, bf16 conversion, scale, axpy, dot): bit-identical;
//  * softmax, silu, silu_mul and its du: 5e-7 relative (measured ≤ 2.6e-7), plus 1e-30 absolute, below which
//    float intermediates are subnormal;
//  * gelu: 1e-6 relative (measured ≤ 5e-7: erfc's t = 1/(1 + p·a) rounding is amplified ~3×), plus 1e-30;
//  * activation derivatives (act_backward gelu/silu, silu_mul's dg): 1e-6 relative plus 1e-7·|dout| absolute
//    (measured ≤ 3.6e-7·|dout|), since the derivatives cross zero where no relative bound can hold.
// Measured maxima are printed per variant ("max err" lines).
#include <gtest/gtest.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/variants.hpp"
#include "kernels/cpu_features.hpp"
#include "xmoe/error.hpp"

// The vector math helpers are compiled here for their instruction sets via target pragmas, so that they can
// be checked against libm directly; only functions in these regions use the wider instructions, and they run
// only after the CPU check.
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#include "kernels/cpu/vector_math_avx2.hpp"
namespace xmoe::kernels::avx2 {
namespace {
void math_eval(int which, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    __m256 r = v;
    if (which == 0) r = exp_ps(v);
    if (which == 1) r = erf_ps(v);
    if (which == 2) r = erfc_ps(v);
    if (which == 3) r = sigmoid_ps(v);
    _mm256_storeu_ps(y + i, r);
  }
}
}  // namespace
}  // namespace xmoe::kernels::avx2
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
#pragma GCC diagnostic push
// GCC 12 bug 105593: false uninitialized warnings inside the AVX-512 intrinsics.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "kernels/cpu/vector_math_avx512.hpp"
namespace xmoe::kernels::avx512 {
namespace {
void math_eval(int which, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    __m512 r = v;
    if (which == 0) r = exp_ps(v);
    if (which == 1) r = erf_ps(v);
    if (which == 2) r = erfc_ps(v);
    if (which == 3) r = sigmoid_ps(v);
    _mm512_storeu_ps(y + i, r);
  }
}
}  // namespace
}  // namespace xmoe::kernels::avx512
#pragma GCC diagnostic pop
#pragma GCC pop_options

namespace xmoe::kernels {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
const int64_t kLengths[] = {0, 1, 7, 15, 16, 17, 33, 1000, 4099};

struct Fns {
  Isa isa;
  void (*softmax_rows_f32)(const float*, float*, int64_t, int64_t);
  void (*bias_act_f32)(Activation, const float*, const float*, float*, int64_t, int64_t);
  void (*act_backward_f32)(Activation, const float*, const float*, float*, int64_t);
  void (*silu_mul_f32)(const float*, const float*, float*, int64_t);
  void (*silu_mul_backward_f32)(const float*, const float*, const float*, float*, float*, int64_t);
  void (*f32_to_bf16)(const float*, bf16*, int64_t);
  void (*bf16_to_f32)(const bf16*, float*, int64_t);
  void (*scale_f32)(float, const float*, float*, int64_t);
  void (*axpy_f32)(float, const float*, float*, int64_t);
  float (*dot_f32)(const float*, const float*, int64_t);
  void (*scale_bf16)(float, const bf16*, bf16*, int64_t);
  void (*axpy_bf16_f32)(float, const bf16*, float*, int64_t);
  float (*dot_bf16_f32)(const bf16*, const float*, int64_t);
};

#define XMOE_TEST_FNS(isa, ns)                                                                    \
  Fns {                                                                                           \
    isa, ns::softmax_rows_f32, ns::bias_act_f32, ns::act_backward_f32, ns::silu_mul_f32,          \
        ns::silu_mul_backward_f32, ns::f32_to_bf16, ns::bf16_to_f32, ns::scale_f32, ns::axpy_f32, \
        ns::dot_f32, ns::scale_bf16, ns::axpy_bf16_f32, ns::dot_bf16_f32                          \
  }

const Fns kReference = XMOE_TEST_FNS(Isa::reference, reference);

Fns fns_for(Isa isa) {
  switch (isa) {
    case Isa::avx2:
      return XMOE_TEST_FNS(Isa::avx2, avx2);
    case Isa::avx512:
      return XMOE_TEST_FNS(Isa::avx512, avx512);
    default:
      return kReference;
  }
}

const char* act_name(Activation a) {
  switch (a) {
    case Activation::identity:
      return "identity";
    case Activation::relu:
      return "relu";
    case Activation::gelu:
      return "gelu";
    case Activation::silu:
      return "silu";
  }
  return "?";
}

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Largest errors seen, for the report lines. Relative errors count only results of magnitude ≥ 1e-30: below
// that the intermediates are subnormal and only the absolute floor applies.
struct ErrorStats {
  double max_rel = 0, max_abs = 0;
  void print(const char* variant, const std::string& what) const {
    std::printf("[ max err  ] %-7s %-28s rel %.3g  abs %.3g\n", variant, what.c_str(), max_rel, max_abs);
  }
};

// v within rtol·|r| + atol of r, NaN where r is NaN, the same infinity where r is infinite.
::testing::AssertionResult near(float v, float r, double rtol, double atol, ErrorStats& stats) {
  if (std::isnan(r) || std::isinf(r) || std::isnan(v) || std::isinf(v)) {
    if ((std::isnan(r) && std::isnan(v)) || v == r) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "got " << v << ", reference " << r;
  }
  const double err = std::fabs(static_cast<double>(v) - static_cast<double>(r));
  stats.max_abs = std::max(stats.max_abs, err);
  if (std::fabs(r) >= 1e-30) stats.max_rel = std::max(stats.max_rel, err / std::fabs(r));
  if (err <= rtol * std::fabs(r) + atol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "got " << v << ", reference " << r << " (error " << err
                                       << ", allowed " << rtol * std::fabs(r) + atol << ")";
}

// Same bits, or both NaN (payloads of NaN results are not part of the contract of float arithmetic).
::testing::AssertionResult same(float v, float r) {
  if (bits_of(v) == bits_of(r) || (std::isnan(v) && std::isnan(r))) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "got " << v << " (0x" << std::hex << bits_of(v) << "), reference "
                                       << r << " (0x" << bits_of(r) << ")";
}

// Inputs drawn from ±scale, with specials sprinkled in when `specials` is set.
std::vector<float> make_values(int64_t n, float scale, bool specials, uint32_t seed) {
  static const float kSpecials[] = {0.0f,   -0.0f,   kInf,    -kInf,    kNaN,  1e30f,  -1e30f,
                                    1e-40f, -1e-40f, 3.4e38f, -3.4e38f, 15.0f, -15.0f, 200.0f};
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  if (specials) {
    for (size_t i = 0; i < v.size(); i += 5) v[i] = kSpecials[(i / 5) % std::size(kSpecials)];
  }
  return v;
}

class Elementwise : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!isa_supported(detect_cpu_features(), GetParam())) {
      GTEST_SKIP() << isa_name(GetParam()) << " is not supported on this CPU";
    }
    v = fns_for(GetParam());
    name = isa_name(GetParam());
  }
  Fns v{};
  const char* name = "";
};

TEST_P(Elementwise, SoftmaxMatchesReference) {
  ErrorStats stats;
  const float scales[] = {1.0f, 30.0f, 1e4f};
  for (int64_t cols : kLengths) {
    for (float scale : scales) {
      const int64_t rows = 3;
      std::vector<float> x = make_values(rows * cols, scale, false, static_cast<uint32_t>(cols * 7 + 1));
      if (cols > 0) {
        // Row 1: a large common offset (exercises the max subtraction) and some −inf entries (exactly 0 out).
        for (int64_t c = 0; c < cols; ++c) x[static_cast<size_t>(cols + c)] += 1e3f;
        for (int64_t c = 0; c < cols; c += 3) x[static_cast<size_t>(cols + c)] = -kInf;
      }
      std::vector<float> want(x.size()), got(x.size());
      kReference.softmax_rows_f32(x.data(), want.data(), rows, cols);
      v.softmax_rows_f32(x.data(), got.data(), rows, cols);
      for (size_t i = 0; i < x.size(); ++i) {
        ASSERT_TRUE(near(got[i], want[i], 5e-7, 1e-30, stats))
            << "cols " << cols << " scale " << scale << " i " << i;
      }
      // In place gives the same bits as out of place.
      std::vector<float> inplace = x;
      v.softmax_rows_f32(inplace.data(), inplace.data(), rows, cols);
      for (size_t i = 0; i < x.size(); ++i) ASSERT_TRUE(same(inplace[i], got[i])) << "in place, i " << i;
    }
  }
  stats.print(name, "softmax");
}

TEST_P(Elementwise, SoftmaxSpecialRows) {
  const int64_t cols = 19;
  std::vector<float> x = make_values(5 * cols, 3.0f, false, 5);
  for (int64_t c = 0; c < cols; ++c) x[static_cast<size_t>(c)] = -kInf;  // row 0: all −inf → NaN (as PyTorch)
  x[static_cast<size_t>(cols + 4)] = kInf;                               // row 1: +inf → NaN
  x[static_cast<size_t>(2 * cols + 17)] = kNaN;                          // row 2: NaN → NaN
  for (int64_t c = 1; c < cols; ++c) x[static_cast<size_t>(3 * cols + c)] = -kInf;  // row 3: one finite entry
  std::vector<float> want(x.size()), got(x.size());
  kReference.softmax_rows_f32(x.data(), want.data(), 5, cols);
  v.softmax_rows_f32(x.data(), got.data(), 5, cols);
  for (int64_t c = 0; c < 3 * cols; ++c) {
    EXPECT_TRUE(std::isnan(want[static_cast<size_t>(c)]));
    EXPECT_TRUE(std::isnan(got[static_cast<size_t>(c)])) << c;
  }
  EXPECT_EQ(got[static_cast<size_t>(3 * cols)], 1.0f);
  for (int64_t c = 1; c < cols; ++c) EXPECT_TRUE(same(got[static_cast<size_t>(3 * cols + c)], 0.0f));
  ErrorStats stats;
  for (int64_t c = 4 * cols; c < 5 * cols; ++c) {
    EXPECT_TRUE(near(got[static_cast<size_t>(c)], want[static_cast<size_t>(c)], 5e-7, 1e-30, stats));
  }
  // Extreme but finite inputs stay finite: the row max is subtracted before exp.
  const float extreme[] = {1000.0f, -1000.0f, 3.4e38f, -3.4e38f, 0.0f};
  float out[5];
  v.softmax_rows_f32(extreme, out, 1, 5);
  EXPECT_EQ(out[2], 1.0f);
  for (int i : {0, 1, 3, 4}) EXPECT_TRUE(same(out[i], 0.0f)) << i;
}

TEST_P(Elementwise, BiasActMatchesReference) {
  const float scales[] = {1.0f, 8.0f, 120.0f};
  for (Activation act : {Activation::identity, Activation::relu, Activation::gelu, Activation::silu}) {
    ErrorStats stats;
    const bool exact = act == Activation::identity || act == Activation::relu;
    const double rtol = act == Activation::gelu ? 1e-6 : 5e-7;
    for (int64_t cols : kLengths) {
      for (float scale : scales) {
        for (bool with_bias : {false, true}) {
          const int64_t rows = 2;
          const uint32_t seed = static_cast<uint32_t>(cols * 13 + static_cast<int64_t>(scale));
          const std::vector<float> x = make_values(rows * cols, scale, true, seed);
          const std::vector<float> bias = make_values(cols, 0.5f, false, seed + 1);
          const float* b = with_bias ? bias.data() : nullptr;
          std::vector<float> want(x.size()), got(x.size());
          kReference.bias_act_f32(act, x.data(), b, want.data(), rows, cols);
          v.bias_act_f32(act, x.data(), b, got.data(), rows, cols);
          for (size_t i = 0; i < x.size(); ++i) {
            if (exact) {
              ASSERT_TRUE(same(got[i], want[i])) << act_name(act) << " cols " << cols << " i " << i;
            } else {
              ASSERT_TRUE(near(got[i], want[i], rtol, 1e-30, stats))
                  << act_name(act) << " x " << x[i] << " cols " << cols << " i " << i;
            }
          }
          std::vector<float> inplace = x;
          v.bias_act_f32(act, inplace.data(), b, inplace.data(), rows, cols);
          for (size_t i = 0; i < x.size(); ++i) ASSERT_TRUE(same(inplace[i], got[i])) << "in place, i " << i;
        }
      }
    }
    if (!exact) stats.print(name, std::string("bias_act ") + act_name(act));
  }
}

TEST_P(Elementwise, ActivationLimitsAndSigns) {
  const float x[] = {-kInf, kInf, -0.0f, 0.0f, kNaN, -1e30f, 1e30f, -20.0f, 20.0f};
  const int64_t n = static_cast<int64_t>(std::size(x));
  float y[std::size(x)];
  v.bias_act_f32(Activation::gelu, x, nullptr, y, 1, n);
  EXPECT_TRUE(same(y[0], -0.0f));
  EXPECT_EQ(y[1], kInf);
  EXPECT_TRUE(same(y[2], -0.0f));
  EXPECT_TRUE(same(y[3], 0.0f));
  EXPECT_TRUE(std::isnan(y[4]));
  EXPECT_TRUE(same(y[5], -0.0f));
  EXPECT_EQ(y[6], 1e30f);
  EXPECT_EQ(y[8], 20.0f);
  v.bias_act_f32(Activation::silu, x, nullptr, y, 1, n);
  EXPECT_TRUE(same(y[0], -0.0f));
  EXPECT_EQ(y[1], kInf);
  EXPECT_TRUE(same(y[2], -0.0f));
  EXPECT_TRUE(std::isnan(y[4]));
  EXPECT_EQ(y[6], 1e30f);
  const std::vector<float> ones(std::size(x), 1.0f);
  for (Activation act : {Activation::gelu, Activation::silu}) {
    v.act_backward_f32(act, x, ones.data(), y, n);
    EXPECT_EQ(y[0], 0.0f) << act_name(act);
    EXPECT_EQ(y[1], 1.0f) << act_name(act);
    EXPECT_NEAR(y[2], 0.5f, 1e-7) << act_name(act);
    EXPECT_TRUE(std::isnan(y[4])) << act_name(act);
    EXPECT_EQ(y[5], 0.0f) << act_name(act);
    EXPECT_EQ(y[6], 1.0f) << act_name(act);
  }
  // relu' is a select: an infinite gradient where pre ≤ 0 gives 0, not NaN.
  const float pre[] = {-1.0f, 0.0f, 2.0f, kNaN};
  const float dout[] = {kInf, kNaN, 3.0f, 5.0f};
  float din[4];
  v.act_backward_f32(Activation::relu, pre, dout, din, 4);
  EXPECT_TRUE(same(din[0], 0.0f));
  EXPECT_TRUE(same(din[1], 0.0f));
  EXPECT_EQ(din[2], 3.0f);
  EXPECT_TRUE(same(din[3], 0.0f));
}

TEST_P(Elementwise, ActBackwardMatchesReference) {
  const float scales[] = {1.0f, 8.0f, 120.0f};
  for (Activation act : {Activation::identity, Activation::relu, Activation::gelu, Activation::silu}) {
    ErrorStats stats;
    const bool exact = act == Activation::identity || act == Activation::relu;
    for (int64_t n : kLengths) {
      for (float scale : scales) {
        const uint32_t seed = static_cast<uint32_t>(n * 17 + static_cast<int64_t>(scale));
        const std::vector<float> pre = make_values(n, scale, true, seed);
        const std::vector<float> dout = make_values(n, 2.0f, false, seed + 1);
        std::vector<float> want(pre.size()), got(pre.size());
        kReference.act_backward_f32(act, pre.data(), dout.data(), want.data(), n);
        v.act_backward_f32(act, pre.data(), dout.data(), got.data(), n);
        for (size_t i = 0; i < pre.size(); ++i) {
          if (exact) {
            ASSERT_TRUE(same(got[i], want[i])) << act_name(act) << " n " << n << " i " << i;
          } else {
            ASSERT_TRUE(near(got[i], want[i], 1e-6, 1e-7 * std::fabs(dout[i]), stats))
                << act_name(act) << " pre " << pre[i] << " n " << n << " i " << i;
          }
        }
        std::vector<float> inplace = dout;  // din == dout
        v.act_backward_f32(act, pre.data(), inplace.data(), inplace.data(), n);
        for (size_t i = 0; i < pre.size(); ++i) ASSERT_TRUE(same(inplace[i], got[i])) << "in place, i " << i;
      }
    }
    if (!exact) stats.print(name, std::string("act_backward ") + act_name(act));
  }
}

TEST_P(Elementwise, SiluMulAndBackwardMatchReference) {
  ErrorStats fwd, dg_stats, du_stats;
  for (int64_t n : kLengths) {
    for (float scale : {1.0f, 8.0f, 120.0f}) {
      const uint32_t seed = static_cast<uint32_t>(n * 19 + static_cast<int64_t>(scale));
      const std::vector<float> g = make_values(n, scale, true, seed);
      const std::vector<float> u = make_values(n, 3.0f, false, seed + 1);
      const std::vector<float> dout = make_values(n, 2.0f, false, seed + 2);
      std::vector<float> want(g.size()), got(g.size());
      kReference.silu_mul_f32(g.data(), u.data(), want.data(), n);
      v.silu_mul_f32(g.data(), u.data(), got.data(), n);
      for (size_t i = 0; i < g.size(); ++i)
        ASSERT_TRUE(near(got[i], want[i], 5e-7, 1e-30, fwd)) << "g " << g[i];

      std::vector<float> dg_want(g.size()), du_want(g.size()), dg(g.size()), du(g.size());
      kReference.silu_mul_backward_f32(g.data(), u.data(), dout.data(), dg_want.data(), du_want.data(), n);
      v.silu_mul_backward_f32(g.data(), u.data(), dout.data(), dg.data(), du.data(), n);
      for (size_t i = 0; i < g.size(); ++i) {
        const double scale_dg = 1e-7 * std::fabs(static_cast<double>(dout[i]) * u[i]);
        ASSERT_TRUE(near(dg[i], dg_want[i], 1e-6, scale_dg, dg_stats)) << "g " << g[i] << " n " << n;
        ASSERT_TRUE(near(du[i], du_want[i], 5e-7, 1e-30, du_stats)) << "g " << g[i] << " n " << n;
      }
      // Outputs written over inputs: dg over g, du over u.
      std::vector<float> g2 = g, u2 = u;
      v.silu_mul_backward_f32(g2.data(), u2.data(), dout.data(), g2.data(), u2.data(), n);
      for (size_t i = 0; i < g.size(); ++i) {
        ASSERT_TRUE(same(g2[i], dg[i]));
        ASSERT_TRUE(same(u2[i], du[i]));
      }
    }
  }
  fwd.print(name, "silu_mul");
  dg_stats.print(name, "silu_mul_backward dg");
  du_stats.print(name, "silu_mul_backward du");
}

TEST_P(Elementwise, Bf16ConversionIsExact) {
  // Every bf16 pattern to f32.
  std::vector<bf16> all(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i].bits = static_cast<uint16_t>(i);
  std::vector<float> want(all.size()), got(all.size());
  kReference.bf16_to_f32(all.data(), want.data(), 65536);
  v.bf16_to_f32(all.data(), got.data(), 65536);
  for (size_t i = 0; i < all.size(); ++i) ASSERT_EQ(bits_of(got[i]), bits_of(want[i])) << i;

  // f32 to bf16: random bit patterns (all classes, NaN payloads included) and the edge cases.
  std::vector<float> x;
  const uint32_t edges[] = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00000u,
                            0x7f800001u, 0xff800001u, 0x7fffffffu, 0x7f7fffffu, 0xff7fffffu, 0x00000001u,
                            0x007fffffu, 0x00800000u, 0x3f808000u, 0x3f818000u, 0x3f808001u, 0x3f807fffu,
                            0xbf808000u, 0xbf818000u, 0x7f7f8000u, 0x7f7f7fffu, 0x00008000u, 0x00018000u};
  for (uint32_t e : edges) x.push_back(from_bits(e));
  std::mt19937 rng(42);
  for (int i = 0; i < 200000; ++i) x.push_back(from_bits(static_cast<uint32_t>(rng())));
  for (int i = 0; i < 20000; ++i)
    x.push_back(from_bits((static_cast<uint32_t>(rng()) & 0xffff0000u) | 0x8000u));
  for (int64_t n : kLengths) {
    const int64_t len = std::min<int64_t>(n, static_cast<int64_t>(x.size()));
    std::vector<float> in(x.begin(), x.begin() + len);
    std::vector<bf16> w(in.size()), g(in.size());
    kReference.f32_to_bf16(in.data(), w.data(), len);
    v.f32_to_bf16(in.data(), g.data(), len);
    for (size_t i = 0; i < in.size(); ++i) ASSERT_EQ(g[i].bits, w[i].bits) << i;
  }
  std::vector<bf16> w(x.size()), g(x.size());
  kReference.f32_to_bf16(x.data(), w.data(), static_cast<int64_t>(x.size()));
  v.f32_to_bf16(x.data(), g.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(g[i].bits, w[i].bits) << "input 0x" << std::hex << bits_of(x[i]);
    ASSERT_EQ(w[i].bits, bf16::from_float(x[i]));
  }
}

TEST_P(Elementwise, RowOpsAreBitIdentical) {
  for (int64_t n : kLengths) {
    const uint32_t seed = static_cast<uint32_t>(n * 23 + 3);
    const std::vector<float> x = make_values(n, 4.0f, false, seed);
    const std::vector<float> y0 = make_values(n, 4.0f, false, seed + 1);
    std::vector<bf16> xb(x.size());
    kReference.f32_to_bf16(x.data(), xb.data(), n);
    for (float a : {0.37f, -2.5f, 0.0f}) {
      std::vector<float> want(x.size()), got(x.size());
      kReference.scale_f32(a, x.data(), want.data(), n);
      v.scale_f32(a, x.data(), got.data(), n);
      for (size_t i = 0; i < x.size(); ++i) ASSERT_TRUE(same(got[i], want[i])) << "scale_f32 " << i;

      want = y0;
      got = y0;
      kReference.axpy_f32(a, x.data(), want.data(), n);
      v.axpy_f32(a, x.data(), got.data(), n);
      for (size_t i = 0; i < x.size(); ++i) ASSERT_TRUE(same(got[i], want[i])) << "axpy_f32 " << i;

      want = y0;
      got = y0;
      kReference.axpy_bf16_f32(a, xb.data(), want.data(), n);
      v.axpy_bf16_f32(a, xb.data(), got.data(), n);
      for (size_t i = 0; i < x.size(); ++i) ASSERT_TRUE(same(got[i], want[i])) << "axpy_bf16_f32 " << i;

      std::vector<bf16> wb(x.size()), gb(x.size());
      kReference.scale_bf16(a, xb.data(), wb.data(), n);
      v.scale_bf16(a, xb.data(), gb.data(), n);
      for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(gb[i].bits, wb[i].bits) << "scale_bf16 " << i;
    }
    EXPECT_TRUE(same(v.dot_f32(x.data(), y0.data(), n), kReference.dot_f32(x.data(), y0.data(), n))) << n;
    EXPECT_TRUE(
        same(v.dot_bf16_f32(xb.data(), y0.data(), n), kReference.dot_bf16_f32(xb.data(), y0.data(), n)))
        << n;
  }
}

TEST_P(Elementwise, DotDependsOnlyOnLength) {
  // The same values at every misalignment give the same bits.
  const int64_t n = 1000;
  std::vector<float> a = make_values(n + 16, 3.0f, false, 7), b = make_values(n + 16, 3.0f, false, 8);
  b[5] = -0.0f;
  std::vector<bf16> ab(a.size());
  kReference.f32_to_bf16(a.data(), ab.data(), static_cast<int64_t>(a.size()));
  const float ref = kReference.dot_f32(a.data(), b.data(), n);
  const float ref_b = kReference.dot_bf16_f32(ab.data(), b.data(), n);
  for (int shift = 0; shift < 16; ++shift) {
    std::vector<float> as(a.begin(), a.begin() + n), bs(b.begin(), b.begin() + n);
    std::vector<float> abuf(static_cast<size_t>(n + shift)), bbuf(static_cast<size_t>(n + shift));
    std::copy(as.begin(), as.end(), abuf.begin() + shift);
    std::copy(bs.begin(), bs.end(), bbuf.begin() + shift);
    std::vector<bf16> abbuf(static_cast<size_t>(n + shift));
    std::copy(ab.begin(), ab.begin() + n, abbuf.begin() + shift);
    EXPECT_TRUE(same(v.dot_f32(abuf.data() + shift, bbuf.data() + shift, n), ref)) << shift;
    EXPECT_TRUE(same(v.dot_bf16_f32(abbuf.data() + shift, bbuf.data() + shift, n), ref_b)) << shift;
  }
  // And the canonical order is not a sequential sum: cancellation shows which lanes were paired.
  std::vector<float> ones(128, 1.0f), big(128, 0.0f);
  big[0] = 1e8f;
  big[64] = -1e8f;  // same lane as element 0: 1e8 + 1 ... cancels within lane 0
  for (size_t i = 1; i < 128; ++i) {
    if (i != 64) big[i] = 1.0f;
  }
  EXPECT_EQ(v.dot_f32(big.data(), ones.data(), 128), kReference.dot_f32(big.data(), ones.data(), 128));
  EXPECT_EQ(kReference.dot_f32(big.data(), ones.data(), 128), 126.0f);
}

TEST_P(Elementwise, VectorMathMatchesLibm) {
  const Isa isa = GetParam();
  const int64_t n = 1 << 16;  // a multiple of both widths
  auto eval = [&](int which, const std::vector<float>& x) {
    std::vector<float> y(x.size());
    if (isa == Isa::avx2) avx2::math_eval(which, x.data(), y.data(), static_cast<int64_t>(x.size()));
    if (isa == Isa::avx512) avx512::math_eval(which, x.data(), y.data(), static_cast<int64_t>(x.size()));
    return y;
  };
  auto sweep = [&](float lo, float hi) {
    std::vector<float> x(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i)
      x[static_cast<size_t>(i)] = lo + (hi - lo) * static_cast<float>(i) / (n - 1);
    return x;
  };
  {
    ErrorStats stats;
    std::vector<float> x = sweep(-104.0f, 89.0f);
    const float specials[] = {-kInf, kInf, kNaN, -1000.0f, 1000.0f, 0.0f, -0.0f, 88.72f, 88.73f, -87.5f};
    std::copy(std::begin(specials), std::end(specials), x.begin());
    const std::vector<float> y = eval(0, x);
    for (size_t i = 0; i < x.size(); ++i) {
      const float want = static_cast<float>(std::exp(static_cast<double>(x[i])));
      ASSERT_TRUE(near(y[i], want, 3e-7, 1e-44, stats)) << "exp " << x[i];
    }
    stats.print(isa_name(isa), "exp_ps");
  }
  {
    ErrorStats erf_stats, erfc_stats, sig_stats;
    std::vector<float> x = sweep(-12.0f, 12.0f);
    const float specials[] = {-kInf, kInf, kNaN, 0.0f, -0.0f, 1e-20f, -1e-20f, 1.0f, -1.0f, 0.99999994f};
    std::copy(std::begin(specials), std::end(specials), x.begin());
    const std::vector<float> e = eval(1, x), c = eval(2, x), s = eval(3, x);
    for (size_t i = 0; i < x.size(); ++i) {
      const double xd = x[i];
      ASSERT_TRUE(near(e[i], static_cast<float>(std::erf(xd)), 3e-7, 1e-30, erf_stats)) << "erf " << x[i];
      ASSERT_TRUE(near(c[i], static_cast<float>(std::erfc(xd)), 1e-6, 1e-37, erfc_stats)) << "erfc " << x[i];
      const float sig = std::isnan(x[i]) ? kNaN : static_cast<float>(1.0 / (1.0 + std::exp(-xd)));
      ASSERT_TRUE(near(s[i], sig, 3e-7, 1e-37, sig_stats)) << "sigmoid " << x[i];
    }
    erf_stats.print(isa_name(isa), "erf_ps");
    erfc_stats.print(isa_name(isa), "erfc_ps");
    sig_stats.print(isa_name(isa), "sigmoid_ps");
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, Elementwise, ::testing::Values(Isa::avx2, Isa::avx512),
                         [](const ::testing::TestParamInfo<Isa>& info) {
                           return std::string(isa_name(info.param));
                         });

// The reference against closed forms, so that the oracle itself is checked.
TEST(ElementwiseReference, KnownValues) {
  const float x[] = {1.0f, -1.0f, 0.0f, 3.0f};
  float y[4];
  reference::bias_act_f32(Activation::gelu, x, nullptr, y, 1, 4);
  EXPECT_FLOAT_EQ(y[0], 0.841344746f);
  EXPECT_FLOAT_EQ(y[1], -0.158655254f);
  EXPECT_EQ(y[2], 0.0f);
  EXPECT_FLOAT_EQ(y[3], 2.99595031f);
  reference::bias_act_f32(Activation::silu, x, nullptr, y, 1, 4);
  EXPECT_FLOAT_EQ(y[0], 0.731058579f);
  EXPECT_FLOAT_EQ(y[1], -0.268941421f);
  const float ones[] = {1.0f, 1.0f, 1.0f, 1.0f};
  reference::act_backward_f32(Activation::gelu, x, ones, y, 4);
  EXPECT_FLOAT_EQ(y[0], 1.08331547f);  // Φ(1) + φ(1)
  EXPECT_FLOAT_EQ(y[2], 0.5f);
  reference::act_backward_f32(Activation::silu, x, ones, y, 4);
  EXPECT_FLOAT_EQ(y[0], 0.927670512f);  // σ(1)(1 + 1·(1 − σ(1)))
  EXPECT_FLOAT_EQ(y[2], 0.5f);

  const float logits[] = {1.0f, 2.0f, 3.0f};
  float p[3];
  reference::softmax_rows_f32(logits, p, 1, 3);
  EXPECT_FLOAT_EQ(p[0], 0.0900305732f);
  EXPECT_FLOAT_EQ(p[1], 0.244728471f);
  EXPECT_FLOAT_EQ(p[2], 0.665240956f);

  // Ties round to even: 1 + 2⁻⁸ (tie, even below) and 1 + 3·2⁻⁸ (tie, even above).
  EXPECT_EQ(bf16::from_float(1.00390625f), 0x3f80);
  EXPECT_EQ(bf16::from_float(1.01171875f), 0x3f82);
  const float vals[] = {1.00390625f, 1.01171875f};
  bf16 out[2];
  reference::f32_to_bf16(vals, out, 2);
  EXPECT_EQ(out[0].bits, 0x3f80);
  EXPECT_EQ(out[1].bits, 0x3f82);
}

TEST(ElementwiseReference, NegativeLengthsThrow) {
  float x = 0.0f;
  EXPECT_THROW(reference::scale_f32(1.0f, &x, &x, -1), Error);
  EXPECT_THROW(reference::softmax_rows_f32(&x, &x, 1, -1), Error);
}

}  // namespace
}  // namespace xmoe::kernels
