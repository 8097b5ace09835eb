// The kernel table the MoE blocks' experts run with at inference. Decode hands each expert a handful of rows,
// where the GEMM (which packs op(B) on every call) reads the expert's weights at a fraction of the memory
// bandwidth. This table is the regular one except that GEMMs of the experts' form, C = A · Bᵀ with B a
// row-major [n, k] weight, run the linear kernels (weights streamed once per block of rows). Those compute
// every row the same way whatever the row count, so a token's expert output still does not depend on how many
// other tokens chose the same expert. Other GEMM forms fall through to the regular table.
#pragma once
#include "kernels/kernels.hpp"

namespace xmoe::llm {

// `isa` must be supported by this CPU (as from a kernel table the model already selected).
const kernels::KernelTable& expert_kernel_table(kernels::Isa isa);

}  // namespace xmoe::llm
