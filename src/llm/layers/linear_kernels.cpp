#include "llm/layers/linear_kernels.hpp"

namespace xmoe::llm {

const LinearKernels& reference_linear_kernels() {
  static const LinearKernels table{kernels::Isa::reference, &linear_reference::f32, &linear_reference::bf16w};
  return table;
}

const LinearKernels& linear_kernels(kernels::Isa isa) {
  static const LinearKernels avx512{kernels::Isa::avx512, &linear_avx512::f32, &linear_avx512::bf16w};
  static const LinearKernels avx2{kernels::Isa::avx2, &linear_avx2::f32, &linear_avx2::bf16w};
  if (isa >= kernels::Isa::avx512) return avx512;
  return isa >= kernels::Isa::avx2 ? avx2 : reference_linear_kernels();
}

}  // namespace xmoe::llm
