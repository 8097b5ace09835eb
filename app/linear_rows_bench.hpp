// `xmoe linear-bench --rows 1,8,32`: the f32/bf16 linear kernels at the row counts inference produces
// (batched decode and expert GEMMs in prefill), at Qwen3-30B-A3B's shapes, each weight read once per call
// from DRAM (distinct copies), against both limits measured in the same run: the register-only FMA peak
// (register_fma_peak.hpp, re-measured before each shape) and the read-bandwidth probe. Medians. Where the
// level has bf16 products, bf16 weights run at both matmul precisions ("bf16m": medium, against the VDPBF16PS
// peak).
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/kernels.hpp"

namespace xmoe::app {

void run_linear_rows_bench(const kernels::KernelTable& table, const kernels::CpuFeatures& features,
                           int threads, int reps, const std::vector<int64_t>& rows);

}  // namespace xmoe::app
