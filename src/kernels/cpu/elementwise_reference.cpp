// Scalar element-wise kernels: the oracle the vector variants are tested against, and the fallback table.
//
// Two kinds of contract:
//  * exact operations (scale, axpy, dot, bf16 conversion, identity/relu) do in float exactly what the vector
//    variants do, with FMA where they use FMA, so every variant is bit-identical to this one;
//  * transcendental ones (softmax's exp, gelu, silu and their derivatives) are evaluated in double from the
//  float
//    inputs and rounded once at the end, so they are nearly correctly rounded and the vector variants' errors
//    are measured against (almost) the true value. Softmax's x − max is taken in float, as its definition in
//    f32 says; only exp, the sum and the division are in double.
//
// Canonical reduction order (dot products), shared by all variants so that results depend on n only: element
// i goes to lane i mod 64, each lane accumulates with FMA in increasing i, then lanes are added pairwise (j,
// j + 32), (j, j + 16), ..., (0, 1).
#include <cmath>
#include <limits>

#include "kernels/cpu/variants.hpp"
#include "xmoe/error.hpp"

namespace xmoe::kernels::reference {

namespace {

constexpr int64_t kLanes = 64;

float reduce_lanes(float (&acc)[kLanes]) {
  for (int64_t width = kLanes / 2; width >= 1; width /= 2) {
    for (int64_t j = 0; j < width; ++j) acc[j] = acc[j] + acc[j + width];
  }
  return acc[0];
}

template <class A>
float dot_lanes(const A* a, const float* b, int64_t n) {
  float acc[kLanes] = {};
  for (int64_t i = 0; i < n; ++i) {
    float& lane = acc[i % kLanes];
    lane = std::fma(static_cast<float>(a[i]), b[i], lane);
  }
  return reduce_lanes(acc);
}

// 0 > v ? 0 : v, the semantics of MAXPS(0, v): NaN and −0 pass through, as in the vector variants.
float relu(float v) {
  return 0.0f > v ? 0.0f : v;
}

double gelu(double x) {
  // The formula would give −inf·0 at −inf; the limit is −0.
  if (x == -std::numeric_limits<double>::infinity()) return -0.0;
  return 0.5 * x * std::erfc(-x / std::sqrt(2.0));  // erfc keeps the left tail's relative accuracy
}

double gelu_grad(double x) {
  // Beyond ±40 the derivative is exactly 0 or 1 in double; clamping avoids inf·0 at ±inf. NaN passes.
  if (x > 40.0) x = 40.0;
  if (x < -40.0) x = -40.0;
  constexpr double kInvSqrt2Pi = 0.398942280401432677939946059934;
  return 0.5 * std::erfc(-x / std::sqrt(2.0)) + x * std::exp(-0.5 * x * x) * kInvSqrt2Pi;
}

double silu(double x) {
  // σ(−800) = 0 exactly in double, so the clamp changes nothing but −inf·0 at −inf (limit −0).
  if (x < -800.0) x = -800.0;
  return x / (1.0 + std::exp(-x));
}

double silu_grad(double x) {
  if (x > 800.0) x = 800.0;
  if (x < -800.0) x = -800.0;
  const double s = 1.0 / (1.0 + std::exp(-x));
  return s * (1.0 + x * (1.0 - s));
}

float act_forward(Activation act, float v) {
  switch (act) {
    case Activation::identity:
      return v;
    case Activation::relu:
      return relu(v);
    case Activation::gelu:
      return static_cast<float>(gelu(v));
    case Activation::silu:
      return static_cast<float>(silu(v));
  }
  XMOE_CHECK(false, "unknown activation ", static_cast<int>(act));
  return v;
}

void check_size(int64_t n) {
  XMOE_CHECK(n >= 0, "element-wise kernel: negative length ", n);
}

}  // namespace

void softmax_rows_f32(const float* in, float* out, int64_t rows, int64_t cols) {
  XMOE_CHECK(rows >= 0 && cols >= 0, "softmax_rows_f32: negative shape [", rows, ", ", cols, "]");
  for (int64_t r = 0; r < rows; ++r) {
    if (cols == 0) break;
    const float* x = in + r * cols;
    float* y = out + r * cols;
    // A +inf, an all −inf row or any NaN makes the row NaN (inf − inf or NaN in the sum), as in PyTorch.
    float mx = -std::numeric_limits<float>::infinity();
    for (int64_t c = 0; c < cols; ++c) mx = mx > x[c] ? mx : x[c];
    double sum = 0.0;
    for (int64_t c = 0; c < cols; ++c) sum += std::exp(static_cast<double>(x[c] - mx));
    // exp is recomputed rather than stored so that the single rounding happens after the division; y[c] is
    // written only after its x[c] has been read, which keeps in == out valid.
    for (int64_t c = 0; c < cols; ++c)
      y[c] = static_cast<float>(std::exp(static_cast<double>(x[c] - mx)) / sum);
  }
}

void bias_act_f32(Activation act, const float* in, const float* bias, float* out, int64_t rows,
                  int64_t cols) {
  XMOE_CHECK(rows >= 0 && cols >= 0, "bias_act_f32: negative shape [", rows, ", ", cols, "]");
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t i = r * cols + c;
      // Without bias there is no "+ 0", which would turn −0 into +0.
      const float v = bias != nullptr ? in[i] + bias[c] : in[i];
      out[i] = act_forward(act, v);
    }
  }
}

void act_backward_f32(Activation act, const float* pre, const float* dout, float* din, int64_t n) {
  check_size(n);
  for (int64_t i = 0; i < n; ++i) {
    const float p = pre[i];
    const float d = dout[i];
    switch (act) {
      case Activation::identity:
        din[i] = d;
        break;
      // A select: an inf or NaN gradient where pre ≤ 0 gives 0, not NaN.
      case Activation::relu:
        din[i] = p > 0.0f ? d : 0.0f;
        break;
      case Activation::gelu:
        din[i] = static_cast<float>(static_cast<double>(d) * gelu_grad(p));
        break;
      case Activation::silu:
        din[i] = static_cast<float>(static_cast<double>(d) * silu_grad(p));
        break;
      default:
        XMOE_CHECK(false, "act_backward_f32: unknown activation ", static_cast<int>(act));
    }
  }
}

void silu_mul_f32(const float* g, const float* u, float* out, int64_t n) {
  check_size(n);
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(silu(g[i]) * static_cast<double>(u[i]));
}

void silu_mul_backward_f32(const float* g, const float* u, const float* dout, float* dg, float* du,
                           int64_t n) {
  check_size(n);
  for (int64_t i = 0; i < n; ++i) {
    // All three inputs are read before either output is written, so dg or du may alias an input.
    const double gv = g[i], uv = u[i], d = dout[i];
    dg[i] = static_cast<float>(d * uv * silu_grad(gv));
    du[i] = static_cast<float>(d * silu(gv));
  }
}

void f32_to_bf16(const float* in, bf16* out, int64_t n) {
  check_size(n);
  for (int64_t i = 0; i < n; ++i) out[i].bits = bf16::from_float(in[i]);
}

void bf16_to_f32(const bf16* in, float* out, int64_t n) {
  check_size(n);
  for (int64_t i = 0; i < n; ++i) out[i] = bf16::to_float(in[i].bits);
}

void scale_f32(float a, const float* x, float* y, int64_t n) {
  check_size(n);
  for (int64_t i = 0; i < n; ++i) y[i] = a * x[i];
}

void axpy_f32(float a, const float* x, float* y, int64_t n) {
  check_size(n);
  for (int64_t i = 0; i < n; ++i) y[i] = std::fma(a, x[i], y[i]);
}

float dot_f32(const float* a, const float* b, int64_t n) {
  check_size(n);
  return dot_lanes(a, b, n);
}

void scale_bf16(float a, const bf16* x, bf16* y, int64_t n) {
  check_size(n);
  for (int64_t i = 0; i < n; ++i) y[i].bits = bf16::from_float(a * bf16::to_float(x[i].bits));
}

void axpy_bf16_f32(float a, const bf16* x, float* y, int64_t n) {
  check_size(n);
  for (int64_t i = 0; i < n; ++i) y[i] = std::fma(a, bf16::to_float(x[i].bits), y[i]);
}

float dot_bf16_f32(const bf16* a, const float* b, int64_t n) {
  check_size(n);
  return dot_lanes(a, b, n);
}

}  // namespace xmoe::kernels::reference
