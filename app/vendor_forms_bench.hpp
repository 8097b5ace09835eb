// `xmoe linear-bench --vendor-forms`: where a kernel level's table holds another form of a kernel for AMD
// CPUs than for the others (kernel_table picks by CPUID vendor: the medium precision's decode, tuned on Zen 4
// and on Sapphire Rapids), both forms' batch-1 decode on this CPU, each format and shape streamed from
// distinct copies in alternated passes beside a read probe of the same size, so that a host whose bandwidth
// moves between levels within seconds moves both alike. Prints each form's median GB/s, its share of the
// probes' median and the median per-pass ratio of the two: whether this CPU gets the faster form.
#pragma once
#include <cstddef>

#include "kernels/kernels.hpp"

namespace xmoe::app {

// Returns the number of (shape, format) pairs compared (0: the two vendors' tables hold the same kernels).
int run_vendor_forms_bench(kernels::Isa isa, const kernels::CpuFeatures& features,
                           kernels::MatmulPrecision precision, int reps, size_t stream_bytes);

}  // namespace xmoe::app
