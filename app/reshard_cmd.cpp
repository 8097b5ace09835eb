#include "reshard_cmd.hpp"

#include <cstdio>
#include <vector>

#include "xmoe/reshard.hpp"

namespace xmoe::app {

namespace {

const CLI::Validator kRankCount(
    [](std::string& s) -> std::string {
      try {
        size_t used = 0;
        const long long v = std::stoll(s, &used);
        if (used == s.size() && v > 0 && v <= 1'000'000) return {};
      } catch (const std::exception&) {
      }
      return "must be a positive integer (a rank count), got '" + s + "'";
    },
    "POSITIVE");

}  // namespace

CLI::App* add_reshard_subcommand(CLI::App& app, ReshardOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "reshard", "Convert expert-parallel safetensors checkpoints between rank counts (tutel.checkpoint)");
  cmd->require_subcommand(1);

  o.gather =
      cmd->add_subcommand("gather", "Merge N per-rank files into one checkpoint with [E, ...] experts");
  o.gather->add_option("--inputs", o.inputs, "per-rank file pattern with {rank} and optionally {size}")
      ->required();
  o.gather->add_option("--input_size", o.input_size, "number of rank files N")->required()->check(kRankCount);
  o.gather->add_option("--output", o.output, "merged checkpoint to write")->required();

  o.scatter = cmd->add_subcommand("scatter", "Split a merged checkpoint into N per-rank files");
  o.scatter->add_option("--input", o.input, "merged checkpoint")->required();
  o.scatter->add_option("--output_size", o.output_size, "number of ranks N (E % N == 0 or N % E == 0)")
      ->required()
      ->check(kRankCount);
  o.scatter->add_option("--outputs", o.outputs, "per-rank file pattern with {rank} and optionally {size}")
      ->required();
  return cmd;
}

int run_reshard(const ReshardOptions& o) {
  if (o.gather && o.gather->parsed()) {
    std::vector<std::string> inputs;
    for (int r = 0; r < o.input_size; ++r) inputs.push_back(expand_rank_pattern(o.inputs, r, o.input_size));
    reshard_gather(inputs, o.output);
    std::printf("gathered %d rank files into %s\n", o.input_size, o.output.c_str());
    return 0;
  }
  reshard_scatter(o.input, o.output_size, o.outputs);
  std::printf("scattered %s into %d rank files (%s)\n", o.input.c_str(), o.output_size,
              expand_rank_pattern(o.outputs, 0, o.output_size).c_str());
  return 0;
}

}  // namespace xmoe::app
