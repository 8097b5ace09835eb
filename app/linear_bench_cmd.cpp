#include "linear_bench_cmd.hpp"

#include <omp.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <random>
#include <vector>

#include "cli_checks.hpp"
#include "decode_profile.hpp"
#include "kernels/cpu_features.hpp"
#include "kernels/kernels.hpp"
#include "kernels/linear.hpp"
#include "kernels/read_bandwidth.hpp"
#include "linear_rows_bench.hpp"
#include "matmul_precision_option.hpp"
#include "stats.hpp"
#include "util/clock.hpp"
#include "vendor_forms_bench.hpp"
#include "weight_copies.hpp"
#include "xmoe/error.hpp"

namespace xmoe::app {

namespace {

using kernels::PackedWeight;
using kernels::WeightFormat;

// Seconds on the chosen clock: wall time, or the calling thread's CPU time (one thread: on a loaded machine
// the time the kernel actually ran, not the time it waited for a core).
double clock_seconds(bool thread_cpu) {
  return thread_cpu ? cpu_seconds(CLOCK_THREAD_CPUTIME_ID) : wall_seconds();
}

}  // namespace

CLI::App* add_linear_bench_subcommand(CLI::App& app, LinearBenchOptions& o) {
  CLI::App* cmd = app.add_subcommand("linear-bench",
                                     "Linear kernels per weight format (bf16, fp8_block, mxfp4, nvfp4) at "
                                     "Qwen3-30B-A3B shapes: decode GB/s vs "
                                     "the read-bandwidth probe, prefill GFLOP/s vs bf16, in one run");
  cmd->add_option("--threads", o.threads, "OpenMP threads")->check(positive_integer())->capture_default_str();
  cmd->add_option("--reps", o.reps, "timed repetitions (medians)")
      ->check(positive_integer())
      ->capture_default_str();
  cmd->add_option("--stream-mb", o.stream_mb,
                  "decode: MiB of distinct weight copies streamed per format (default: 512, or twice the "
                  "largest CPU cache where that is more)")
      ->check(positive_integer());
  cmd->add_option("--prefill-rows", o.prefill_rows, "prefill: rows m")
      ->check(positive_integer())
      ->capture_default_str();
  cmd->add_option("--clock", o.clock,
                  "wall | thread (the thread's CPU time, for --threads 1 on a loaded machine)")
      ->check(CLI::IsMember({"wall", "thread"}))
      ->capture_default_str();
  cmd->add_option("--isa", o.isa, "kernel level: reference | avx2 | avx512 | avx512_bf16 (default: best)")
      ->check(CLI::IsMember({"reference", "avx2", "avx512", "avx512_bf16", "amx"}));
  cmd->add_option("--rows", o.rows,
                  "instead: f32/bf16 kernels at these row counts m (e.g. 1,8,16,32,64) against the FMA peak "
                  "and the read bandwidth")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  cmd->add_option("--model", o.model,
                  "instead: one batch-1 decode step of this Qwen3-MoE checkpoint's weights, per op class "
                  "(attention, router, experts, lm_head) against the read probe, mapped vs anonymous")
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--madvise", o.madvise, "with --model: advice on the mapped weights first")
      ->check(CLI::IsMember({"none", "hugepage", "sequential", "willneed"}))
      ->capture_default_str();
  cmd->add_flag("--vendor-forms", o.vendor_forms,
                "instead: batch-1 decode in the forms the kernel table takes for AMD CPUs and for others "
                "(with --matmul-precision medium), passes alternated beside a read probe, on this CPU");
  add_matmul_precision_option(cmd, o.matmul_precision);
  return cmd;
}

int run_linear_bench(const LinearBenchOptions& o) {
  XMOE_CHECK(o.clock != "thread" || o.threads == 1, "linear-bench: --clock thread needs --threads 1, got ",
             o.threads);
  const bool thread_clock = o.clock == "thread";
  omp_set_num_threads(o.threads);
  const auto features = kernels::detect_cpu_features();
  const kernels::MatmulPrecision precision =
      effective_matmul_precision(o.matmul_precision, o.isa, DType::bf16);
  const kernels::KernelTable& table = kernels::kernel_table(
      o.isa.empty() ? kernels::best_isa(features) : kernels::parse_isa(o.isa), features, precision);
  std::printf("cpu: %s, kernel level %s, %s precision, %d threads, %s clock\n", features.str().c_str(),
              kernels::isa_name(table.isa), kernels::matmul_precision_name(table.precision), o.threads,
              o.clock.c_str());
  if (!o.model.empty()) {
    DecodeProfileOptions p;
    p.model = o.model;
    p.steps = o.reps;
    p.madvise = o.madvise;
    p.thread_clock = thread_clock;
    return run_decode_profile(table, p);
  }
  if (o.vendor_forms) {
    run_vendor_forms_bench(table.isa, features, table.precision, o.reps,
                           o.stream_mb > 0 ? static_cast<size_t>(o.stream_mb) << 20
                                           : stream_bytes_beyond_caches(size_t{512} << 20));
    return 0;
  }
  if (!o.rows.empty()) {
    run_linear_rows_bench(table, features, o.threads, o.reps, o.rows);
    return 0;
  }
  const double probe_before = kernels::measure_read_bandwidth_gbs();
  std::printf("read-bandwidth probe: %.2f GB/s\n", probe_before);

  // FP8 twice: with f32 block scales (Qwen3-FP8, GLM-FP8) and with powers of two (DeepSeek-V3.1's ue8m0).
  struct Format {
    WeightFormat f;
    bool ue8m0;
    const char* name;
  };
  const Format formats[] = {{WeightFormat::bf16, false, "bf16"},
                            {WeightFormat::fp8_block, false, "fp8_block"},
                            {WeightFormat::fp8_block, true, "fp8_ue8m0"},
                            {WeightFormat::mxfp4, false, "mxfp4"},
                            {WeightFormat::nvfp4, false, "nvfp4"}};
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::printf("\n%-15s %-10s %12s %10s %9s %10s %14s %10s\n", "shape N x K", "format", "bytes/matrix",
              "decode GB/s", "of probe", "cached GB/s", "prefill GFLOP/s", "vs bf16");
  for (const BenchShape& s : kBenchShapes) {
    std::vector<float> w(static_cast<size_t>(s.n * s.k));
    for (auto& v : w) v = normal(rng);
    std::vector<float> x(static_cast<size_t>(o.prefill_rows * s.k)),
        y(static_cast<size_t>(o.prefill_rows * s.n));
    for (auto& v : x) v = normal(rng);
    double bf16_gflops = 0;
    for (const auto& [f, ue8m0, name] : formats) {
      const OwnedWeight one = make_weight(f, w, s.n, s.k, ue8m0);
      const size_t bytes = one.view.bytes();
      // Decode: m = 1 over distinct copies, each read once per pass.
      const size_t stream = o.stream_mb > 0 ? static_cast<size_t>(o.stream_mb) << 20
                                            : stream_bytes_beyond_caches(size_t{512} << 20);
      const size_t count = std::max<size_t>(2, stream / bytes);
      double gbs;
      {
        const WeightCopies set = copy_weight(one.view, count);
        std::vector<double> rates;
        for (int r = 0; r <= o.reps; ++r) {
          const double t0 = clock_seconds(thread_clock);
          for (const PackedWeight& c : set.views) kernels::linear_forward(table, c, x.data(), 1, y.data());
          const double t = clock_seconds(thread_clock) - t0;
          if (r > 0)
            rates.push_back(static_cast<double>(bytes * count) / t / 1e9);  // the first pass warms up
        }
        gbs = median(rates);
      }
      // The same decode over one matrix read again and again (from L2 or L3): the kernel's rate when memory
      // is not the limit, a ceiling for the DRAM rate above that another process's bandwidth cannot move
      // (with --clock thread).
      double hot_gbs;
      {
        const int inner = static_cast<int>(std::max<size_t>(1, (size_t{64} << 20) / bytes));
        std::vector<double> rates;
        for (int r = 0; r <= o.reps; ++r) {
          const double t0 = clock_seconds(thread_clock);
          for (int i = 0; i < inner; ++i) kernels::linear_forward(table, one.view, x.data(), 1, y.data());
          const double t = clock_seconds(thread_clock) - t0;
          if (r > 0) rates.push_back(static_cast<double>(bytes) * inner / t / 1e9);
        }
        hot_gbs = median(rates);
      }
      // Prefill: m rows over one matrix.
      std::vector<double> gflops;
      for (int r = 0; r <= o.reps; ++r) {
        const double t0 = clock_seconds(thread_clock);
        kernels::linear_forward(table, one.view, x.data(), o.prefill_rows, y.data());
        const double t = clock_seconds(thread_clock) - t0;
        if (r > 0) gflops.push_back(2.0 * static_cast<double>(o.prefill_rows * s.n * s.k) / t / 1e9);
      }
      const double pf = median(gflops);
      if (f == WeightFormat::bf16) bf16_gflops = pf;
      char shape[32];
      std::snprintf(shape, sizeof(shape), "%lldx%lld", static_cast<long long>(s.n),
                    static_cast<long long>(s.k));
      std::printf("%-15s %-10s %12zu %10.2f %8.0f%% %10.2f %14.1f %9.2fx\n", shape, name, bytes, gbs,
                  100.0 * gbs / probe_before, hot_gbs, pf, pf / bf16_gflops);
    }
  }
  const double probe_after = kernels::measure_read_bandwidth_gbs();
  std::printf("\nread-bandwidth probe after: %.2f GB/s (shares above are of the first probe, %.2f GB/s)\n",
              probe_after, probe_before);
  return 0;
}

}  // namespace xmoe::app
