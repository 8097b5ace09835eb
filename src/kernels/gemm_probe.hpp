// GEMM throughput probes behind `xmoe bench`: achieved GFLOP/s of a kernel table's GEMM, and the in-cache
// rate it reaches, against which the experts' rate is reported.
#pragma once
#include <cstdint>

#include "kernels/kernels.hpp"
#include "xmoe/dtype.hpp"

namespace xmoe::kernels {

// Times t's GEMM for `dtype` (f32, bf16 or f64) on C[m, n] = A[m, k] · B[k, n], all row-major and
// untransposed, using all OpenMP threads (the GEMM's own). Repeats the call for about `seconds` after one
// warm-up call (at least three timed calls) and returns 2·m·n·k / median call time, in GFLOP/s. Throws
// xmoe::Error when the table has no GEMM for `dtype` or a size is not positive.
double measure_gemm_gflops(const KernelTable& t, DType dtype, int64_t m, int64_t n, int64_t k,
                           double seconds);

// The practical peak of t's GEMM for `dtype`: the rate of a GEMM whose operands stay in cache (per thread a
// 256 × 512 block of C over k = 1024, a few MB in L2 and L3), so the microkernel and packing, not DRAM,
// bound it. It is what the kernels reach on this machine, not the datasheet FMA peak: packing is only partly
// amortised at this size, so on Zen 4 it reads about 75-85% of a register-only FMA loop. Takes ~0.3 s.
double measure_fma_peak_gflops(const KernelTable& t, DType dtype);

}  // namespace xmoe::kernels
