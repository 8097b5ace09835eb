#include "linear_rows_bench.hpp"

#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>

#include "kernels/linear.hpp"
#include "kernels/read_bandwidth.hpp"
#include "kernels/register_fma_peak.hpp"
#include "stats.hpp"
#include "weight_copies.hpp"
#include "xmoe/dtype.hpp"

namespace xmoe::app {

namespace {

using kernels::PackedWeight;
using kernels::WeightFormat;

// `count` distinct copies of one [n, k] matrix in `format` (f32 or bf16).
WeightCopies make_copies(WeightFormat format, const std::vector<float>& w, int64_t n, int64_t k,
                         size_t count) {
  const int64_t es = format == WeightFormat::f32 ? 4 : 2;
  std::vector<std::byte> one(static_cast<size_t>(n * k * es));
  for (int64_t i = 0; i < n * k; ++i) {
    const float f = w[static_cast<size_t>(i)];
    const uint16_t h = bf16::from_float(f);
    std::memcpy(one.data() + i * es, format == WeightFormat::f32 ? static_cast<const void*>(&f) : &h,
                static_cast<size_t>(es));
  }
  PackedWeight v;
  v.format = format;
  v.rows = n;
  v.cols = k;
  v.row_bytes = k * es;
  v.data = one.data();
  return copy_weight(v, count);
}

}  // namespace

void run_linear_rows_bench(const kernels::KernelTable& table, const kernels::CpuFeatures& features,
                           int threads, int reps, const std::vector<int64_t>& rows) {
  struct Shape {
    const char* what;
    int64_t n, k;
  };
  const Shape shapes[] = {{"expert gate+up", 1536, 2048},
                          {"expert down", 2048, 768},
                          {"attention q", 4096, 2048},
                          {"attention o", 2048, 4096}};
  // bf16 weights at both matmul precisions where the level has bf16 products (linear_precision.hpp); the
  // medium rows are measured against the VDPBF16PS peak.
  struct Variant {
    WeightFormat format;
    const kernels::KernelTable* table;
    const char* label;
  };
  std::vector<Variant> variants{{WeightFormat::f32, &table, "f32"}, {WeightFormat::bf16, &table, "bf16"}};
  const kernels::KernelTable& medium =
      kernels::kernel_table(table.isa, features, kernels::MatmulPrecision::medium);
  if (medium.precision == kernels::MatmulPrecision::medium && table.isa != kernels::Isa::reference)
    variants.push_back({WeightFormat::bf16, &medium, "bf16m"});
  const double bandwidth = kernels::measure_read_bandwidth_gbs();
  std::printf("read-bandwidth probe: %.2f GB/s\n", bandwidth);
  std::printf("\n%-15s %-10s %-5s %5s %11s %9s %9s %9s\n", "shape", "N x K", "fmt", "rows", "GFLOP/s",
              "of FMA pk", "GB/s", "of probe");
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  for (const Shape& s : shapes) {
    std::vector<float> w(static_cast<size_t>(s.n * s.k));
    for (float& v : w) v = normal(rng);
    for (const Variant& variant : variants) {
      const WeightFormat format = variant.format;
      const bool bf16_dot = variant.table->precision == kernels::MatmulPrecision::medium;
      const size_t one = static_cast<size_t>(s.n * s.k) * (format == WeightFormat::f32 ? 4 : 2);
      // Copies beyond the caches: each call reads its weight from DRAM, as a model's experts are read.
      const WeightCopies set = make_copies(
          format, w, s.n, s.k, std::max<size_t>(2, stream_bytes_beyond_caches(size_t{96} << 20) / one));
      const double peak =
          bf16_dot ? kernels::register_bf16_product_peak_gflops(variant.table->isa, features, threads)
                   : kernels::register_fma_peak_gflops(table.isa, features, threads);
      for (const int64_t m : rows) {
        std::vector<float> x(static_cast<size_t>(m * s.k)), y(static_cast<size_t>(m * s.n));
        for (float& v : x) v = normal(rng);
        std::vector<double> seconds;
        size_t next = 0;
        for (int r = 0; r <= reps; ++r) {
          // At least ~20 ms per timing, over copies not read since the last pass.
          int calls = 0;
          const auto t0 = std::chrono::steady_clock::now();
          double t = 0;
          do {
            kernels::linear_forward(*variant.table, set.views[next], x.data(), m, y.data());
            next = (next + 1) % set.views.size();
            ++calls;
            t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          } while (t < 0.02);
          if (r > 0) seconds.push_back(t / calls);  // the first timing warms up
        }
        const double t = median(seconds);
        const double gflops = 2.0 * static_cast<double>(m * s.n * s.k) / t / 1e9;
        const double gbs = static_cast<double>(one) / t / 1e9;
        char nk[32];
        std::snprintf(nk, sizeof(nk), "%lldx%lld", static_cast<long long>(s.n), static_cast<long long>(s.k));
        std::printf("%-15s %-10s %-5s %5lld %11.1f %8.0f%% %9.2f %8.0f%%\n", s.what, nk, variant.label,
                    static_cast<long long>(m), gflops, 100 * gflops / peak, gbs, 100 * gbs / bandwidth);
      }
      std::printf("%-15s register-only %s peak (%s, %d threads): %.1f GFLOP/s\n", "",
                  bf16_dot ? kernels::bf16_product_peak_name(variant.table->isa) : "FMA",
                  kernels::isa_name(table.isa), threads, peak);
      std::fflush(stdout);
    }
  }
}

}  // namespace xmoe::app
