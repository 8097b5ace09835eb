// `xmoe a2a-bench`: Tutel's bandwidth_test for xmoe's Communicator, timed against the raw blocking MPI call
// of the same size in the same run. Run it under mpirun; without mpirun it runs as a one-rank job.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <vector>

namespace xmoe::app {

struct A2aBenchOptions {
  int64_t size_mb = 256;       // Tutel's --size_mb: the send buffer of every collective, in MiB
  std::vector<int64_t> sizes;  // several send-buffer sizes in MiB; when given it replaces size_mb
  int loop = 50;
  int warmup = 5;
  bool use_2dh = false;  // also time the hierarchical all-to-all
  int local_size = 0;    // ranks per node for --use_2dh; 0 = the LOCAL_SIZE environment variable
};

// Adds the `a2a-bench` subcommand to `app`; returns it.
CLI::App* add_a2a_bench_subcommand(CLI::App& app, A2aBenchOptions& o);

// Runs the benchmark (collective over the MPI job); throws xmoe::Error on bad options. Returns the exit code.
int run_a2a_bench(const A2aBenchOptions& o);

}  // namespace xmoe::app
