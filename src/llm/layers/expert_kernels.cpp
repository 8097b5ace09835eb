#include "llm/layers/expert_kernels.hpp"

#include <vector>

#include "llm/layers/linear_kernels.hpp"
#include "llm/layers/weights.hpp"

namespace xmoe::llm {

namespace {

// Looked up once per level: detecting the CPU's features on every GEMM call would cost more than a small one.
template <kernels::Isa I>
const kernels::KernelTable& regular() {
  static const kernels::KernelTable& table = kernels::kernel_table(I, kernels::detect_cpu_features());
  return table;
}

template <class In>
bool is_linear_form(const kernels::GemmArgs<In, float>& g) {
  return !g.trans_a && g.trans_b && !g.accumulate && g.ldb == g.k && g.k > 0 && g.lda >= g.k;
}

template <kernels::Isa I>
void gemm_f32_rows(const kernels::GemmArgs<float, float>& g) {
  if (!is_linear_form(g)) return regular<I>().gemm_f32(g);
  linear_rows(linear_kernels(I), g.a, g.m, g.lda, g.b, g.n, g.k, g.c, g.ldc);
}

template <kernels::Isa I>
void gemm_bf16_rows(const kernels::GemmArgs<bf16, float>& g) {
  if (!is_linear_form(g)) return regular<I>().gemm_bf16(g);
  // The linear kernels take f32 rows: the activations are few next to the weights.
  std::vector<float> a(static_cast<size_t>(g.m * g.k));
  for (int64_t i = 0; i < g.m; ++i) regular<I>().bf16_to_f32(g.a + i * g.lda, a.data() + i * g.k, g.k);
  linear_rows(linear_kernels(I), a.data(), g.m, g.k, g.b, g.n, g.k, g.c, g.ldc);
}

template <kernels::Isa I>
kernels::KernelTable make_table() {
  kernels::KernelTable t = regular<I>();
  t.gemm_f32 = &gemm_f32_rows<I>;
  t.gemm_bf16 = &gemm_bf16_rows<I>;
  return t;
}

}  // namespace

const kernels::KernelTable& expert_kernel_table(kernels::Isa isa) {
  // Only levels with a vector linear kernel gain anything; the reference GEMM already runs rows
  // independently.
  switch (isa) {
    case kernels::Isa::avx2: {
      static const kernels::KernelTable t = make_table<kernels::Isa::avx2>();
      return t;
    }
    case kernels::Isa::avx512: {
      static const kernels::KernelTable t = make_table<kernels::Isa::avx512>();
      return t;
    }
    case kernels::Isa::avx512_bf16:
    case kernels::Isa::amx: {
      static const kernels::KernelTable t = make_table<kernels::Isa::avx512_bf16>();
      return t;
    }
    default:
      return kernels::kernel_table(isa, kernels::detect_cpu_features());
  }
}

}  // namespace xmoe::llm
