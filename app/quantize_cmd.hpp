// `xmoe quantize --to fp8-block|mxfp4|nvfp4 IN OUT`: converts a BF16 / F16 / F32 Hugging Face checkpoint
// into a published quantized layout (app/quant_checkpoint.hpp), tensor by tensor in bounded memory, keeping
// its shards, and copying the tokenizer, chat template and generation config.
#pragma once
#include <CLI/CLI.hpp>
#include <string>

namespace xmoe::app {

struct QuantizeOptions {
  std::string to;
  std::string layout;  // --quant-layout: "" (the format's default) | modelopt | compressed-tensors
  std::string in, out;
};

CLI::App* add_quantize_subcommand(CLI::App& app, QuantizeOptions& o);
int run_quantize(const QuantizeOptions& o);

}  // namespace xmoe::app
