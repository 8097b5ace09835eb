// `xmoe linear-bench`: the linear kernels per weight format at Qwen3-30B-A3B's shapes. Decode-shaped (m = 1)
// weight streaming in GB/s as a share of the read-bandwidth probe measured in the same run, and
// prefill-shaped (m = 512) GFLOP/s against the BF16 linear in the same run. Medians.
#pragma once
#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace xmoe::app {

struct LinearBenchOptions {
  int threads = 2;
  int reps = 7;
  int64_t stream_mb = 0;  // decode: distinct weight copies per format (0: 512 MiB or twice the largest cache)
  int64_t prefill_rows = 512;
  std::string isa;             // "" = best
  std::string clock = "wall";  // or "thread": the thread's CPU time (one thread)
  std::vector<int64_t> rows;   // non-empty: the row sweep of linear_rows_bench.hpp instead
  std::string model;           // non-empty: the per-op decode-step profile of decode_profile.hpp instead
  std::string madvise = "none";
  bool vendor_forms =
      false;  // the table's per-vendor kernel forms side by side instead (vendor_forms_bench.hpp)
  std::string matmul_precision = "highest";  // highest | medium (bf16 products, as generate's option)
};

CLI::App* add_linear_bench_subcommand(CLI::App& app, LinearBenchOptions& o);
int run_linear_bench(const LinearBenchOptions& o);

}  // namespace xmoe::app
