#include "vendor_forms_bench.hpp"

#include <cstdio>
#include <random>
#include <vector>

#include "kernels/cpu_features.hpp"
#include "kernels/linear.hpp"
#include "kernels/read_bandwidth.hpp"
#include "stats.hpp"
#include "util/clock.hpp"
#include "weight_copies.hpp"

namespace xmoe::app {

namespace {

using kernels::KernelTable;
using kernels::PackedWeight;
using kernels::WeightFormat;

// GB/s of one decode pass (one x row) over every copy.
double decode_pass(const KernelTable& table, const WeightCopies& copies, const float* x, float* y) {
  const double t0 = wall_seconds();
  for (const PackedWeight& c : copies.views) kernels::linear_forward(table, c, x, 1, y);
  const double t = wall_seconds() - t0;
  return static_cast<double>(copies.views.front().bytes() * copies.views.size()) / t / 1e9;
}

}  // namespace

int run_vendor_forms_bench(kernels::Isa isa, const kernels::CpuFeatures& features,
                           kernels::MatmulPrecision precision, int reps, size_t stream_bytes) {
  kernels::CpuFeatures as[2] = {features, features};
  as[0].amd = false;
  as[1].amd = true;
  const KernelTable* tables[2] = {&kernels::kernel_table(isa, as[0], precision),
                                  &kernels::kernel_table(isa, as[1], precision)};
  kernels::ReadProbe probe(stream_bytes);
  std::printf(
      "decode (1 x row) in the forms the %s %s table takes for other vendors' CPUs and for AMD's, "
      "on this %s CPU: %d passes each over %.0f MiB of copies, alternated with a read probe of the "
      "same size; medians\n",
      kernels::isa_name(tables[0]->isa), kernels::matmul_precision_name(precision),
      features.amd ? "AMD" : "non-AMD", reps, static_cast<double>(probe.bytes()) / (1 << 20));
  std::printf("\n%-15s %-10s %10s %14s %9s %14s %9s %11s\n", "shape N x K", "format", "probe GB/s",
              "others' GB/s", "of probe", "AMD's GB/s", "of probe", "AMD/others");
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  int compared = 0;
  for (const BenchShape& s : kBenchShapes) {
    std::vector<float> w(static_cast<size_t>(s.n * s.k)), x(static_cast<size_t>(s.k)),
        y(static_cast<size_t>(s.n));
    for (auto& v : w) v = normal(rng);
    for (auto& v : x) v = normal(rng);
    for (const WeightFormat f :
         {WeightFormat::bf16, WeightFormat::fp8_block, WeightFormat::mxfp4, WeightFormat::nvfp4}) {
      if (tables[0]->linear[static_cast<size_t>(f)] == tables[1]->linear[static_cast<size_t>(f)]) continue;
      const OwnedWeight one = make_weight(f, w, s.n, s.k);
      const WeightCopies copies = copy_weight(one.view, std::max<size_t>(2, stream_bytes / one.view.bytes()));
      std::vector<double> probes, rates[2], ratios;
      for (int r = 0; r <= reps; ++r) {  // the first round warms up
        const double p = probe.measure();
        double rate[2];
        for (int i = 0; i < 2; ++i) {  // which form goes first alternates
          const int form = (r + i) % 2;
          rate[form] = decode_pass(*tables[form], copies, x.data(), y.data());
        }
        if (r == 0) continue;
        probes.push_back(p);
        for (int form = 0; form < 2; ++form) rates[form].push_back(rate[form]);
        ratios.push_back(rate[1] / rate[0]);
      }
      const double pm = median(probes), others = median(rates[0]), amd = median(rates[1]);
      char shape[32];
      std::snprintf(shape, sizeof(shape), "%lldx%lld", static_cast<long long>(s.n),
                    static_cast<long long>(s.k));
      std::printf("%-15s %-10s %10.2f %14.2f %8.0f%% %14.2f %8.0f%% %10.2fx\n", shape,
                  kernels::weight_format_name(f), pm, others, 100.0 * others / pm, amd, 100.0 * amd / pm,
                  median(ratios));
      ++compared;
    }
  }
  if (compared == 0) std::printf("(the two tables hold the same kernels at this level and precision)\n");
  return compared;
}

}  // namespace xmoe::app
