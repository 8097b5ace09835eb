// The layer's element types: storage type S (f32, bf16, f64) and accumulation type Acc (f32, or f64 for f64),
// with the row operations the MoE stages need, routed to the kernel table (f32/bf16) or plain loops (f64,
// which exists for gradient checks).
#pragma once
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernels/kernels.hpp"

namespace xmoe::moe {

template <class S>
using acc_t = std::conditional_t<std::is_same_v<S, double>, double, float>;

template <class S>
struct Ops {
  using Acc = acc_t<S>;
  const kernels::KernelTable* k = nullptr;

  void gemm(const kernels::GemmArgs<S, Acc>& a) const {
    if constexpr (std::is_same_v<S, float>)
      k->gemm_f32(a);
    else if constexpr (std::is_same_v<S, bf16>)
      k->gemm_bf16(a);
    else
      k->gemm_f64(a);
  }
  // GEMM on accumulation-type operands (small gate products, f32 copies of bf16 data).
  void gemm_acc(const kernels::GemmArgs<Acc, Acc>& a) const {
    if constexpr (std::is_same_v<Acc, float>)
      k->gemm_f32(a);
    else
      k->gemm_f64(a);
  }

  // y = a·x, stored.
  void scale_row(Acc a, const S* x, S* y, int64_t n) const {
    if constexpr (std::is_same_v<S, float>)
      k->scale_f32(a, x, y, n);
    else if constexpr (std::is_same_v<S, bf16>)
      k->scale_bf16(a, x, y, n);
    else
      for (int64_t i = 0; i < n; ++i) y[i] = a * x[i];
  }
  // y = a·x from an accumulation-type row.
  void scale_acc_row(Acc a, const Acc* x, S* y, int64_t n) const {
    if constexpr (std::is_same_v<S, float>) {
      k->scale_f32(a, x, y, n);
    } else if constexpr (std::is_same_v<S, bf16>) {
      if (a == 1.0f) {
        k->f32_to_bf16(x, y, n);
      } else {
        for (int64_t i = 0; i < n; ++i) y[i] = bf16(a * x[i]);
      }
    } else {
      for (int64_t i = 0; i < n; ++i) y[i] = a * x[i];
    }
  }
  // y += a·x.
  void axpy_row(Acc a, const S* x, Acc* y, int64_t n) const {
    if constexpr (std::is_same_v<S, float>)
      k->axpy_f32(a, x, y, n);
    else if constexpr (std::is_same_v<S, bf16>)
      k->axpy_bf16_f32(a, x, y, n);
    else
      for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
  }
  void axpy_acc(Acc a, const Acc* x, Acc* y, int64_t n) const {
    if constexpr (std::is_same_v<Acc, float>)
      k->axpy_f32(a, x, y, n);
    else
      for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
  }
  Acc dot_row(const S* x, const Acc* y, int64_t n) const {
    if constexpr (std::is_same_v<S, float>) {
      return k->dot_f32(x, y, n);
    } else if constexpr (std::is_same_v<S, bf16>) {
      return k->dot_bf16_f32(x, y, n);
    } else {
      double s = 0;
      for (int64_t i = 0; i < n; ++i) s += x[i] * y[i];
      return s;
    }
  }
  void to_storage(const Acc* in, S* out, int64_t n) const {
    if constexpr (std::is_same_v<S, bf16>)
      k->f32_to_bf16(in, out, n);
    else if (in != out)
      std::copy(in, in + n, out);
  }
  void to_acc(const S* in, Acc* out, int64_t n) const {
    if constexpr (std::is_same_v<S, bf16>)
      k->bf16_to_f32(in, out, n);
    else if (in != out)
      std::copy(in, in + n, out);
  }
  void softmax_rows(const Acc* in, Acc* out, int64_t rows, int64_t cols) const {
    if constexpr (std::is_same_v<Acc, float>) {
      k->softmax_rows_f32(in, out, rows, cols);
    } else {
      for (int64_t r = 0; r < rows; ++r) {
        const Acc* x = in + r * cols;
        Acc* y = out + r * cols;
        Acc m = -INFINITY;
        for (int64_t c = 0; c < cols; ++c) m = std::max(m, x[c]);
        Acc s = 0;
        for (int64_t c = 0; c < cols; ++c) s += (y[c] = std::exp(x[c] - m));
        for (int64_t c = 0; c < cols; ++c) y[c] /= s;
      }
    }
  }
  void bias_act(kernels::Activation act, const Acc* in, const Acc* bias, Acc* out, int64_t rows,
                int64_t cols) const {
    if constexpr (std::is_same_v<Acc, float>) {
      k->bias_act_f32(act, in, bias, out, rows, cols);
    } else {
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c)
          out[r * cols + c] = activate(act, in[r * cols + c] + (bias ? bias[c] : 0.0));
    }
  }
  void act_backward(kernels::Activation act, const Acc* pre, const Acc* dout, Acc* din, int64_t n) const {
    if constexpr (std::is_same_v<Acc, float>) {
      k->act_backward_f32(act, pre, dout, din, n);
    } else {
      for (int64_t i = 0; i < n; ++i) din[i] = dout[i] * activate_grad(act, pre[i]);
    }
  }
  void silu_mul(const Acc* g, const Acc* u, Acc* out, int64_t n) const {
    if constexpr (std::is_same_v<Acc, float>) {
      k->silu_mul_f32(g, u, out, n);
    } else {
      for (int64_t i = 0; i < n; ++i) out[i] = activate(kernels::Activation::silu, g[i]) * u[i];
    }
  }
  void silu_mul_backward(const Acc* g, const Acc* u, const Acc* dout, Acc* dg, Acc* du, int64_t n) const {
    if constexpr (std::is_same_v<Acc, float>) {
      k->silu_mul_backward_f32(g, u, dout, dg, du, n);
    } else {
      for (int64_t i = 0; i < n; ++i) {
        const double s = activate(kernels::Activation::silu, g[i]), d = dout[i];
        dg[i] = d * u[i] * activate_grad(kernels::Activation::silu, g[i]);
        du[i] = d * s;
      }
    }
  }

  static double activate(kernels::Activation act, double x) {
    switch (act) {
      case kernels::Activation::identity:
        return x;
      case kernels::Activation::relu:
        return x > 0 ? x : 0.0;
      case kernels::Activation::gelu:
        return 0.5 * x * (1.0 + std::erf(x * M_SQRT1_2));
      case kernels::Activation::silu:
        return x / (1.0 + std::exp(-x));
    }
    return x;
  }
  static double activate_grad(kernels::Activation act, double x) {
    switch (act) {
      case kernels::Activation::identity:
        return 1.0;
      case kernels::Activation::relu:
        return x > 0 ? 1.0 : 0.0;
      case kernels::Activation::gelu:
        return 0.5 * (1.0 + std::erf(x * M_SQRT1_2)) + x * std::exp(-0.5 * x * x) * 0.3989422804014327;
      case kernels::Activation::silu: {
        const double s = 1.0 / (1.0 + std::exp(-x));
        return s * (1.0 + x * (1.0 - s));
      }
    }
    return 1.0;
  }
};

// Row-major GEMM argument builder: C[m,n] (+)= op(A)·op(B).
template <class In, class Out>
kernels::GemmArgs<In, Out> gemm_args(int64_t m, int64_t n, int64_t k, const In* a, int64_t lda, bool ta,
                                     const In* b, int64_t ldb, bool tb, Out* c, int64_t ldc,
                                     bool accumulate) {
  kernels::GemmArgs<In, Out> g;
  g.m = m, g.n = n, g.k = k;
  g.a = a, g.lda = lda, g.trans_a = ta;
  g.b = b, g.ldb = ldb, g.trans_b = tb;
  g.c = c, g.ldc = ldc, g.accumulate = accumulate;
  return g;
}

}  // namespace xmoe::moe
