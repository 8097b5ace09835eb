#include "kernels/gemm_probe.hpp"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "xmoe/error.hpp"

namespace xmoe::kernels {
namespace {

// Small-integer multiples of 1/64 in [-0.5, 0.5): exact in every dtype, so products never meet denormals.
template <class T>
std::vector<T> probe_values(int64_t count, uint32_t seed) {
  std::vector<T> v(static_cast<size_t>(count));
  uint32_t s = seed;
  for (auto& x : v) {
    s = s * 1664525u + 1013904223u;
    x = T(static_cast<float>(static_cast<int>(s >> 26) - 32) / 64.0f);
  }
  return v;
}

template <class In, class Out>
double time_gemm(void (*gemm)(const GemmArgs<In, Out>&), int64_t m, int64_t n, int64_t k, double seconds) {
  XMOE_CHECK(gemm != nullptr, "gemm probe: the kernel table has no GEMM for ", dtype_name(dtype_of<In>()));
  XMOE_CHECK(m > 0 && n > 0 && k > 0, "gemm probe: sizes must be positive, got m=", m, " n=", n, " k=", k);
  const std::vector<In> a = probe_values<In>(m * k, 1), b = probe_values<In>(k * n, 2);
  std::vector<Out> c(static_cast<size_t>(m * n));
  GemmArgs<In, Out> g;
  g.m = m, g.n = n, g.k = k;
  g.a = a.data(), g.lda = k;
  g.b = b.data(), g.ldb = n;
  g.c = c.data(), g.ldc = n;
  gemm(g);  // warm-up: page faults, thread team start-up
  using clock = std::chrono::steady_clock;
  std::vector<double> times;
  const auto start = clock::now();
  while (times.size() < 3 || std::chrono::duration<double>(clock::now() - start).count() < seconds) {
    const auto t0 = clock::now();
    gemm(g);
    times.push_back(std::chrono::duration<double>(clock::now() - t0).count());
  }
  std::nth_element(times.begin(), times.begin() + static_cast<ptrdiff_t>(times.size() / 2), times.end());
  const double median = times[times.size() / 2];
  return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) / median / 1e9;
}

}  // namespace

double measure_gemm_gflops(const KernelTable& t, DType dtype, int64_t m, int64_t n, int64_t k,
                           double seconds) {
  switch (dtype) {
    case DType::f32:
      return time_gemm(t.gemm_f32, m, n, k, seconds);
    case DType::bf16:
      return time_gemm(t.gemm_bf16, m, n, k, seconds);
    case DType::f64:
      return time_gemm(t.gemm_f64, m, n, k, seconds);
  }
  XMOE_CHECK(false, "gemm probe: unknown dtype");
  return 0.0;
}

double measure_fma_peak_gflops(const KernelTable& t, DType dtype) {
  // The GEMM splits m across threads when m is the long side, giving each thread its own 256-row block.
  const int64_t threads = std::max(1, omp_get_max_threads());
  return measure_gemm_gflops(t, dtype, 256 * threads, 512, 1024, 0.3);
}

}  // namespace xmoe::kernels
