// `xmoe generate`: loads a Hugging Face checkpoint, generates from one prompt or several (each its own
// sequence, all decoded together; or one prompt as N concurrent sequences for benchmarks), streams the text
// of a single sequence or prints each sequence's text at the end, and reports prefill / decode tokens/s and
// the weight bandwidth of decoding on stderr (with --measure-bandwidth: against the machine's measured read
// bandwidth and register-only FMA peak).
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

namespace xmoe::app {

struct GenerateOptions {
  std::string model;
  std::vector<std::string> prompts;     // --prompt, repeatable
  std::vector<std::string> prompt_ids;  // --prompt-ids "1,2,3", repeatable
  std::string prompts_file;             // one text prompt per line
  bool chat = false;
  std::string system;
  bool no_think = false;
  bool show_reasoning = false;
  int64_t max_tokens = 128;
  double temperature = 1.0, top_p = 1.0, min_p = 0.0, repetition_penalty = 1.0;
  double presence_penalty = 0.0, frequency_penalty = 0.0;
  int top_k = 0;
  uint64_t seed = 0;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_ids;
  bool ignore_eos = false;
  std::string dtype = "bf16";
  std::string isa;
  std::string matmul_precision = "highest";
  std::string prefault = "auto";
  std::string page_cache = "auto";
  int threads = 0;
  int batch = 1;
  int64_t kv_cache_mb = 1024;
  int64_t prefill_chunk = 512;
  bool no_stream = false;
  bool warmup = false;
  bool print_ids = false;
  bool measure_bandwidth = false;
  bool profile = false;

  // Which sampling flags were given (the others come from generation_config.json).
  CLI::Option *temperature_opt = nullptr, *top_p_opt = nullptr, *min_p_opt = nullptr, *top_k_opt = nullptr,
              *repetition_opt = nullptr, *seed_opt = nullptr, *system_opt = nullptr, *batch_opt = nullptr;
};

CLI::App* add_generate_subcommand(CLI::App& app, GenerateOptions& o);

// Throws xmoe::Error on bad input (missing model files, bad prompt ids, bad sampling values). Returns the
// exit code.
int run_generate(const GenerateOptions& o);

}  // namespace xmoe::app
