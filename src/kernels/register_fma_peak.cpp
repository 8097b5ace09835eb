#include "kernels/register_fma_peak.hpp"

#include <immintrin.h>
#include <omp.h>
#include <time.h>

#include <algorithm>
#include <string>
#include <vector>

#include "kernels/cpu/amx_tiles.hpp"
#include "util/clock.hpp"
#include "xmoe/dtype.hpp"
#include "xmoe/error.hpp"

namespace xmoe::kernels {
namespace {

constexpr int kChains = 12;  // enough independent chains to cover FMA latency × throughput on any x86 core

// Each loop returns a value that depends on every chain, so none can be dropped; `a` and `b` come from the
// caller at run time, so none can be folded.
float chains_scalar(int64_t iters, float a, float b) {
  float acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = static_cast<float>(i);
  for (int64_t r = 0; r < iters; ++r) {
#pragma GCC unroll 12
    for (int i = 0; i < kChains; ++i) acc[i] = acc[i] * a + b;
  }
  float s = 0;
  for (float v : acc) s += v;
  return s;
}

__attribute__((target("avx2,fma"))) float chains_avx2(int64_t iters, float a, float b) {
  __m256 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm256_set1_ps(static_cast<float>(i));
  const __m256 va = _mm256_set1_ps(a), vb = _mm256_set1_ps(b);
  for (int64_t r = 0; r < iters; ++r) {
#pragma GCC unroll 12
    for (int i = 0; i < kChains; ++i) acc[i] = _mm256_fmadd_ps(acc[i], va, vb);
  }
  __m256 s = acc[0];
  for (int i = 1; i < kChains; ++i) s = _mm256_add_ps(s, acc[i]);
  return _mm256_cvtss_f32(s);
}

__attribute__((target("avx512f"))) float chains_avx512(int64_t iters, float a, float b) {
  __m512 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  const __m512 va = _mm512_set1_ps(a), vb = _mm512_set1_ps(b);
  for (int64_t r = 0; r < iters; ++r) {
#pragma GCC unroll 12
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_fmadd_ps(acc[i], va, vb);
  }
  __m512 s = acc[0];
  for (int i = 1; i < kChains; ++i) s = _mm512_add_ps(s, acc[i]);
  return _mm512_cvtss_f32(s);
}

// VDPBF16PS: per f32 lane, two bf16 products added to the accumulator (4 flops).
__attribute__((target("avx512f,avx512bf16"))) float chains_dpbf16(int64_t iters, float a, float b) {
  __m512 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  const __m512bh va = _mm512_cvtne2ps_pbh(_mm512_set1_ps(a), _mm512_set1_ps(b));
  for (int64_t r = 0; r < iters; ++r) {
#pragma GCC unroll 12
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], va, va);
  }
  __m512 s = acc[0];
  for (int i = 1; i < kChains; ++i) s = _mm512_add_ps(s, acc[i]);
  return _mm512_cvtss_f32(s);
}

// TDPBF16PS on tiles that never leave the registers: 4 accumulators over 2 × 2 source tiles, each
// instruction 16 × 16 outputs × 32 bf16 products (16384 flops). The instructions are inline assembly
// (amx_tiles.hpp), so no target attribute is needed.
float chains_tdpbf16(int64_t iters, float a, float b) {
  alignas(64) uint16_t source[512];
  const uint16_t bits[2] = {bf16::from_float(a), bf16::from_float(b)};
  for (int i = 0; i < 512; ++i) source[i] = bits[i % 2];
  alignas(64) float result[256];
  const amx::TileConfig config = amx::full_tiles();
  amx::load_config(config);
  amx::zero<0>(), amx::zero<1>(), amx::zero<2>(), amx::zero<3>();
  amx::load<4>(source, 64), amx::load<5>(source, 64), amx::load<6>(source, 64), amx::load<7>(source, 64);
  for (int64_t r = 0; r < iters; ++r) {
    amx::dpbf16<0, 4, 6>();
    amx::dpbf16<1, 4, 7>();
    amx::dpbf16<2, 5, 6>();
    amx::dpbf16<3, 5, 7>();
  }
  float s = 0;
  amx::store<0>(result, 64), s += result[0];
  amx::store<3>(result, 64), s += result[255];
  amx::release();
  return s;
}

// Seconds on `clock`: wall, the calling thread's CPU time, or the process's CPU time per thread.
double now(PeakClock clock, int threads) {
  switch (clock) {
    case PeakClock::thread_cpu:
      return cpu_seconds(CLOCK_THREAD_CPUTIME_ID);
    case PeakClock::process_cpu:
      return cpu_seconds(CLOCK_PROCESS_CPUTIME_ID) / threads;
    case PeakClock::wall:
      break;
  }
  return omp_get_wtime();
}

// GFLOP/s of `chains` on `threads` threads: seven runs of about seconds / 7 each (sized at a guessed
// 6 GFLOP/s per f32 lane and thread), the median, on `clock` (see PeakClock).
double chains_rate(float (*chains)(int64_t, float, float), double flops_per_iter, int lanes, int threads,
                   double seconds, PeakClock clock) {
  const int64_t iters =
      std::max<int64_t>(1000, static_cast<int64_t>(seconds / 7 * 6e9 * lanes / flops_per_iter));
  std::vector<double> rates;
  float sink = 0;
  for (int run = 0; run < 7; ++run) {
    const double t0 = now(clock, threads);
    if (clock == PeakClock::thread_cpu) {
      sink += chains(iters, 0.999f, 1e-3f);
    } else {
#pragma omp parallel num_threads(threads) reduction(+ : sink)
      sink += chains(iters, 0.999f, 1e-3f);
    }
    const double t = now(clock, threads) - t0;
    rates.push_back(threads * static_cast<double>(iters) * flops_per_iter / t / 1e9);
  }
  volatile float keep = sink;  // the chains' results are used
  (void)keep;
  std::nth_element(rates.begin(), rates.begin() + 3, rates.end());
  return rates[3];
}

// The probes' argument checks: `what` names the probe in the message, `missing` what the CPU/OS lacks.
void check_peak_args(const char* what, bool supported, const std::string& missing, int threads,
                     PeakClock clock) {
  XMOE_CHECK(supported, what, ": ", missing);
  XMOE_CHECK(threads >= 1, what, ": threads must be at least 1, got ", threads);
  XMOE_CHECK(clock != PeakClock::thread_cpu || threads == 1, what,
             ": the thread CPU clock needs 1 thread, got ", threads);
}

}  // namespace

double register_bf16_dot_peak_gflops(const CpuFeatures& features, int threads, double seconds,
                                     PeakClock clock) {
  check_peak_args("bf16 dot peak", features.has_avx512_bf16(), "this CPU/OS has no AVX512-BF16", threads,
                  clock);
  return chains_rate(chains_dpbf16, 4.0 * kChains * 16, 16, threads, seconds, clock);
}

double register_amx_bf16_peak_gflops(const CpuFeatures& features, int threads, double seconds,
                                     PeakClock clock) {
  check_peak_args("amx peak", features.has_amx_bf16(), "this CPU/OS has no AMX-BF16 (or no tile permission)",
                  threads, clock);
  // Sized as 256 f32 lanes' worth (~1.5 TFLOP/s a thread guessed).
  return chains_rate(chains_tdpbf16, 4.0 * 16384, 256, threads, seconds, clock);
}

double register_fma_peak_gflops(Isa isa, const CpuFeatures& features, int threads, double seconds,
                                PeakClock clock) {
  check_peak_args("fma peak", isa_supported(features, isa),
                  std::string(isa_name(isa)) + " is not supported by this CPU/OS", threads, clock);
  float (*chains)(int64_t, float, float) = chains_scalar;
  int lanes = 1;
  if (isa == Isa::avx2) chains = chains_avx2, lanes = 8;
  if (isa >= Isa::avx512) chains = chains_avx512, lanes = 16;
  return chains_rate(chains, 2.0 * kChains * lanes, lanes, threads, seconds, clock);
}

double register_bf16_product_peak_gflops(Isa isa, const CpuFeatures& features, int threads, double seconds,
                                         PeakClock clock) {
  XMOE_CHECK(isa >= Isa::avx512_bf16, "bf16 product peak: ", isa_name(isa), " has no bf16 products");
  return isa == Isa::amx ? register_amx_bf16_peak_gflops(features, threads, seconds, clock)
                         : register_bf16_dot_peak_gflops(features, threads, seconds, clock);
}

const char* bf16_product_peak_name(Isa isa) {
  return isa == Isa::amx ? "TDPBF16PS (AMX)" : "VDPBF16PS";
}

}  // namespace xmoe::kernels
