// The FMA rate this CPU reaches with nothing but registers: independent FMA chains, no loads or stores. It is
// the ceiling every f32-accumulating kernel (GEMM, linear layers with weights decoded in registers) is
// measured against; unlike the in-cache GEMM probe (gemm_probe.hpp) it cannot read low because of packing or
// cache misses, so a kernel's share of it is an honest efficiency.
#pragma once

#include "kernels/cpu_features.hpp"

namespace xmoe::kernels {

// GFLOP/s (2 per FMA lane) of `threads` OpenMP threads each running 12 independent f32 FMA chains of the
// widest vector `isa` has (reference: scalar multiply-add, avx2: 8 lanes, avx512 and above: 16 lanes), for
// about `seconds` in all: the median of several short runs, so a loaded machine's figure moves with what the
// kernels it is compared with see. Throws xmoe::Error if this CPU cannot run `isa` or threads < 1.
// PeakClock::thread_cpu (threads must be 1) times the calling thread's CPU time instead of the wall clock: on
// a shared machine it leaves out the time the thread waited for a core, for comparisons with kernels timed
// the same way (gemm_bench --clock thread). PeakClock::process_cpu times the process's CPU time divided by
// `threads`: each thread's busy time, the rate a team would reach if no thread ever waited for a core (it
// also leaves out the time threads wait for each other), for comparing multi-threaded kernels on a loaded
// machine (gemm_bench --clock process; under OMP_WAIT_POLICY=passive, else threads spinning at the
// barrier count as busy).
enum class PeakClock { wall, thread_cpu, process_cpu };
double register_fma_peak_gflops(Isa isa, const CpuFeatures& features, int threads, double seconds = 0.2,
                                PeakClock clock = PeakClock::wall);

// The same for VDPBF16PS chains (AVX512-BF16: 2 bf16 products per f32 lane, 4 flops), the ceiling of the bf16
// GEMM that uses it; about twice the f32 FMA peak. Throws xmoe::Error without AVX512-BF16 or threads < 1.
double register_bf16_dot_peak_gflops(const CpuFeatures& features, int threads, double seconds = 0.2,
                                     PeakClock clock = PeakClock::wall);

// The same for AMX TDPBF16PS on tiles that stay in the tile registers (16 × 16 outputs × 32 products an
// instruction), the ceiling of the AMX level's BF16 linears: about 15 times the f32 FMA peak on Sapphire
// Rapids. Throws xmoe::Error without AMX-BF16 and the OS's tile permission, or with threads < 1.
double register_amx_bf16_peak_gflops(const CpuFeatures& features, int threads, double seconds = 0.2,
                                     PeakClock clock = PeakClock::wall);

// The ceiling of the bf16 products kernel level `isa` runs (the medium linears, the bf16 GEMM): the AMX peak
// at the AMX level, the VDPBF16PS peak at AVX512-BF16; and its name ("TDPBF16PS (AMX)", "VDPBF16PS"). Throws
// xmoe::Error below AVX512-BF16 or where the probes do.
double register_bf16_product_peak_gflops(Isa isa, const CpuFeatures& features, int threads,
                                         double seconds = 0.2, PeakClock clock = PeakClock::wall);
const char* bf16_product_peak_name(Isa isa);

}  // namespace xmoe::kernels
