// `xmoe serve`: loads a checkpoint and serves the OpenAI, Anthropic and Tutel /chat APIs, /health, /metrics
// and the web chat page over HTTP, every request joining one continuously batched engine.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

namespace xmoe::app {

struct ServeOptions {
  std::string model;
  std::string host = "127.0.0.1";
  int port = 8000;                // 0: a free port, printed
  std::string api_key;            // else XMOE_API_KEY
  std::string served_model_name;  // default: the model directory's name
  int64_t max_seq_len = 0;        // 0: the config's max_position_embeddings
  int max_batch = 16;
  int max_queue = 256;
  int64_t kv_cache_mb = 1024;
  int64_t prefill_chunk = 512;
  int threads = 0;
  std::string dtype = "bf16";
  std::string isa;
  std::string matmul_precision = "highest";
  std::string prefault = "auto";
  std::string page_cache = "auto";
  int64_t max_body_mb = 32;
  int http_threads = 0;  // 0: max_batch + max_queue + 8 (each open connection holds one)
  double shutdown_grace_s = 5.0;
};

CLI::App* add_serve_subcommand(CLI::App& app, ServeOptions& o);

// Serves until SIGINT or SIGTERM; returns the exit code (0 after a graceful shutdown). Throws xmoe::Error on
// bad input (missing model files, a port in use).
int run_serve(const ServeOptions& o);

}  // namespace xmoe::app
