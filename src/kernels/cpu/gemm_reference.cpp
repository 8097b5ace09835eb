// The GEMM oracle: every C element is a plain multiply-then-add chain in ascending k order, accumulated in
// the output type (f32 for f32/bf16 inputs, f64 for f64). The loop order only keeps memory access contiguous.
#include "kernels/cpu/gemm_blocking.hpp"
#include "kernels/cpu/variants.hpp"

namespace xmoe::kernels::reference {
namespace {

template <class Out, class In>
Out widen(In x) {
  if constexpr (std::is_same_v<In, bf16>) {
    return static_cast<Out>(bf16::to_float(x.bits));
  } else {
    return static_cast<Out>(x);
  }
}

template <class In, class Out>
void gemm_loops(const GemmArgs<In, Out>& g) {
  if (gemm_trivial(g)) return;
  auto a_at = [&](int64_t i, int64_t p) {
    return widen<Out>(g.trans_a ? g.a[p * g.lda + i] : g.a[i * g.lda + p]);
  };
  for (int64_t i = 0; i < g.m; ++i) {
    Out* c = g.c + i * g.ldc;
    if (g.trans_b) {
      // op(B) rows are B's columns: a dot product per element keeps B contiguous.
      for (int64_t j = 0; j < g.n; ++j) {
        const In* b = g.b + j * g.ldb;
        Out acc = g.accumulate ? c[j] : Out{};
        for (int64_t p = 0; p < g.k; ++p) acc += a_at(i, p) * widen<Out>(b[p]);
        c[j] = acc;
      }
    } else {
      if (!g.accumulate) std::fill(c, c + g.n, Out{});
      for (int64_t p = 0; p < g.k; ++p) {
        const Out aip = a_at(i, p);
        const In* b = g.b + p * g.ldb;
        for (int64_t j = 0; j < g.n; ++j) c[j] += aip * widen<Out>(b[j]);
      }
    }
  }
}

}  // namespace

void gemm_f32(const GemmArgs<float, float>& args) {
  gemm_loops(args);
}
void gemm_bf16(const GemmArgs<bf16, float>& args) {
  gemm_loops(args);
}
void gemm_f64(const GemmArgs<double, double>& args) {
  gemm_loops(args);
}

}  // namespace xmoe::kernels::reference
