// `xmoe init-model`: writes a random-weight Hugging Face checkpoint of any supported config.json (weights,
// index, config, generation config, a small byte-level tokenizer), streamed to disk in bounded memory.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

namespace xmoe::app {

struct InitModelOptions {
  std::string config;  // config.json to instantiate
  std::string out;     // directory to create (must be absent or empty)
  std::string dtype = "bf16";
  uint64_t seed = 0;
  std::string expert_layout = "per-expert";
  int64_t shard_size_mb = 4096;
  std::string quant;  // "" (none) or a quantized format for the linears: fp8-block | mxfp4 | nvfp4  // MiB
                      // per safetensors shard; one model.safetensors when everything fits
  std::string quant_layout;  // --quant-layout: "" (the format's default) | modelopt | compressed-tensors
  std::string vocab_format;  // --vocab-format: "" (the architecture's) | tokenizer.json | tiktoken
};

CLI::App* add_init_model_subcommand(CLI::App& app, InitModelOptions& o);

// Throws xmoe::Error on a bad config or unwritable output. Returns the exit code.
int run_init_model(const InitModelOptions& o);

}  // namespace xmoe::app
