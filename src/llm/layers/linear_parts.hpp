// Several linears over the same input rows whose outputs lie side by side (q/k/v, gate/up of a checkpoint
// that stores them apart) in one parallel region instead of one per weight: at decode each product is a few
// tens of microseconds of streaming, about what waking the team costs again.
#pragma once
#include <cstdint>
#include <span>

#include "kernels/kernels.hpp"

namespace xmoe::llm {

// y[i, off_p + n] = Σ_k x[i, k] · parts[p][n, k], off_p the rows of the parts before p; x rows ldx apart,
// y rows ldy apart (≥ the parts' rows together). The parts share their column count. Each output is
// computed by the weight's own kernel in its fixed summation order, so the bits are those of one
// kernels::linear_forward per part, for any thread count.
void linear_forward_parts(const kernels::KernelTable& table, std::span<const kernels::PackedWeight> parts,
                          const float* x, int64_t m, int64_t ldx, float* y, int64_t ldy);

}  // namespace xmoe::llm
