// `xmoe reshard gather|scatter`: Tutel's tutel.checkpoint gather/scatter for per-rank safetensors
// checkpoints.
#pragma once
#include <CLI/CLI.hpp>
#include <string>

namespace xmoe::app {

struct ReshardOptions {
  // gather
  std::string inputs;  // pattern with {rank} (and optionally {size})
  int input_size = 0;
  std::string output;
  // scatter
  std::string input;
  int output_size = 0;
  std::string outputs;  // pattern with {rank} (and optionally {size})

  CLI::App* gather = nullptr;
  CLI::App* scatter = nullptr;
};

// Adds the `reshard` subcommand (with `gather` and `scatter`) to `app`; returns it.
CLI::App* add_reshard_subcommand(CLI::App& app, ReshardOptions& o);

// Runs the parsed subcommand; throws xmoe::Error on bad files. Returns the exit code.
int run_reshard(const ReshardOptions& o);

}  // namespace xmoe::app
