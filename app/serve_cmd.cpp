#include "serve_cmd.hpp"

#include <omp.h>
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <string_view>
#include <thread>

#include "cli_checks.hpp"
#include "llm/model_bundle.hpp"
#include "matmul_precision_option.hpp"
#include "prefault_option.hpp"
#include "serve/http_server.hpp"
#include "serve/json_constraint.hpp"
#include "serve/routes.hpp"
#include "serve/service.hpp"
#include "serve/web_page.hpp"
#include "xmoe/error.hpp"

namespace xmoe::app {

CLI::App* add_serve_subcommand(CLI::App& app, ServeOptions& o) {
  CLI::App* cmd =
      app.add_subcommand("serve", "Serve a Hugging Face MoE checkpoint over HTTP (OpenAI, Anthropic, /chat)");
  const CLI::Validator positive = positive_integer();
  cmd->add_option("--model", o.model, "checkpoint directory (config.json, safetensors, tokenizer.json)")
      ->required();
  cmd->add_option("--host", o.host, "address to listen on (127.0.0.1: this machine only)")
      ->capture_default_str();
  cmd->add_option("--port", o.port, "port (0 = any free port, printed)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  cmd->add_option(
      "--api-key", o.api_key,
      "require 'Authorization: Bearer KEY' or 'x-api-key: KEY' on API routes (default: $XMOE_API_KEY)");
  cmd->add_option("--served-model-name", o.served_model_name,
                  "model id in /v1/models (default: the directory's name)");
  cmd->add_option("--max-seq-len", o.max_seq_len,
                  "prompt + generated tokens per sequence (default: config max_position_embeddings)")
      ->check(positive);
  cmd->add_option("--max-batch", o.max_batch, "sequences decoded together")
      ->check(positive)
      ->capture_default_str();
  cmd->add_option("--max-queue", o.max_queue, "sequences waiting beyond the batch before 429/529")
      ->check(non_negative_integer())
      ->capture_default_str();
  cmd->add_option("--kv-cache-mb", o.kv_cache_mb, "KV cache budget in MiB")
      ->check(positive)
      ->capture_default_str();
  cmd->add_option("--prefill-chunk", o.prefill_chunk, "tokens fed to the model per step (prefill chunk)")
      ->check(positive)
      ->capture_default_str();
  cmd->add_option("--threads", o.threads, "OpenMP threads (0 = default)")->check(non_negative_integer());
  cmd->add_option("--dtype", o.dtype, "weights and activations: bf16 | f32")
      ->check(CLI::IsMember({"bf16", "f32"}))
      ->capture_default_str();
  cmd->add_option("--isa", o.isa, "kernel level cap: reference | avx2 | avx512 | avx512_bf16 (default: best)")
      ->check(CLI::IsMember({"reference", "avx2", "avx512", "avx512_bf16", "amx"}));
  add_matmul_precision_option(cmd, o.matmul_precision);
  add_prefault_option(cmd, o.prefault);
  add_page_cache_option(cmd, o.page_cache);
  cmd->add_option("--max-body-mb", o.max_body_mb, "largest request body in MiB (413 beyond)")
      ->check(positive)
      ->capture_default_str();
  cmd->add_option(
         "--http-threads", o.http_threads,
         "connections served at once, idle kept-alive ones included (0 = --max-batch + --max-queue + 8)")
      ->check(non_negative_integer());
  cmd->add_option("--shutdown-grace", o.shutdown_grace_s,
                  "seconds in-flight requests get to finish after SIGINT/SIGTERM before they are cancelled")
      ->check(non_negative_number())
      ->capture_default_str();
  return cmd;
}

namespace {

std::string directory_name(const std::string& dir) {
  std::filesystem::path p(dir);
  if (!p.has_filename()) p = p.parent_path();  // "dir/"
  return std::filesystem::absolute(p).lexically_normal().filename().string();
}

}  // namespace

int run_serve(const ServeOptions& o) {
  signal(SIGPIPE, SIG_IGN);  // a client that leaves must not kill the server
  std::string api_key = o.api_key;
  if (api_key.empty())
    if (const char* env = std::getenv("XMOE_API_KEY")) api_key = env;
  if (o.threads > 0) omp_set_num_threads(o.threads);

  llm::ModelBundle bundle = llm::ModelBundle::open(o.model);
  const Tokenizer& tokenizer = bundle.require_tokenizer("serve");
  const llm::ModelConfig& config = bundle.checkpoint.config();
  const int64_t max_seq_len = o.max_seq_len > 0 ? o.max_seq_len : config.max_position_embeddings;
  XMOE_CHECK(max_seq_len >= 2, "serve: the context length is ", max_seq_len,
             " (config max_position_embeddings); give --max-seq-len");
  const DType dtype = parse_dtype(o.dtype);
  const kernels::MatmulPrecision precision = effective_matmul_precision(o.matmul_precision, o.isa, dtype);
  const llm::PrefaultMode prefault_mode = llm::parse_prefault_mode(o.prefault);
  bundle.load_weights(dtype, o.isa, precision, prefault_mode,
                      llm::parse_page_cache_mode(o.page_cache));  // Ctrl-C still ends the process here
  if (bundle.prefault.worth_saying(prefault_mode))
    std::fprintf(stderr, "xmoe serve: %s\n", bundle.prefault.summary().c_str());

  // From now on SIGINT/SIGTERM are blocked in every thread and taken by sigwait below, so no work happens in
  // a signal handler: in this thread, in OpenMP's workers (made during the load), and in every thread started
  // later (the engine's driver, the HTTP pool), which inherit the mask.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
#pragma omp parallel
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  serve::ModelInfo info;
  info.served_name = o.served_model_name.empty() ? directory_name(o.model) : o.served_model_name;
  info.max_seq_len = max_seq_len;
  info.created = static_cast<int64_t>(std::time(nullptr));
  info.config = &config;
  info.chat = &bundle.chat;
  info.tokenizer = &tokenizer;
  info.output_format = serve::detect_output_format(bundle.chat, config);
  llm::apply_generation_defaults(bundle.chat, info.defaults.sampling);
  info.token_texts = serve::make_token_texts(tokenizer);
  info.chat_template = serve::parse_chat_template(bundle.chat);

  serve::ServiceOptions service_options;
  service_options.max_seq_len = max_seq_len;
  service_options.max_queue = o.max_queue;
  service_options.engine.kv_cache_bytes = static_cast<size_t>(o.kv_cache_mb) << 20;
  service_options.engine.max_running = o.max_batch;
  service_options.engine.max_step_tokens = std::max<int64_t>(o.prefill_chunk, o.max_batch);
  service_options.engine.eos_token_ids = bundle.chat.eos_token_ids;
  // harmony's channels and DeepSeek's, Kimi's and GLM's tool-call markers are special tokens, which their
  // output parsers must see
  service_options.engine.text_stream =
      llm::tokenizer_text_stream(tokenizer, !serve::output_format_uses_special_tokens(info.output_format));
  serve::ServerMetrics metrics;
  serve::Service service(*bundle.model, info, service_options, &metrics);

  const std::string_view page = serve::web_page();
  serve::HttpServerOptions http;
  http.host = o.host;
  http.port = o.port;
  http.api_key = api_key;
  http.max_body_bytes = static_cast<size_t>(o.max_body_mb) << 20;
  http.threads = o.http_threads > 0 ? o.http_threads : o.max_batch + o.max_queue + 8;
  serve::HttpServer server(http,
                           serve::server_routes(
                               metrics, [&service] { return service.gauges(); }, page),
                           serve::api_error_for_path, service, &metrics);
  const int port = server.bind();
  std::printf(
      "xmoe serve: %s (%s, %s, matmul precision %s) as \"%s\", context %lld tokens, batch %d, queue %d%s\n",
      o.model.c_str(), config.architecture.c_str(), dtype_name(bundle.model->dtype()),
      kernels::matmul_precision_name(precision), info.served_name.c_str(),
      static_cast<long long>(max_seq_len), o.max_batch, o.max_queue,
      api_key.empty() ? "" : ", API key required");
  std::printf("xmoe serve: listening on http://%s:%d\n", o.host.c_str(), port);
  std::fflush(stdout);

  std::atomic<bool> stopping{false};
  std::thread http_thread([&] {
    server.run();
    if (!stopping) kill(getpid(), SIGTERM);  // the server ended on its own: shut down the rest
  });
  int sig = 0;
  sigwait(&stop_signals, &sig);
  stopping = true;
  std::fprintf(stderr, "xmoe serve: %s, shutting down\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
  server.stop();  // no new connections; requests in flight go on
  service.shutdown(std::chrono::milliseconds(static_cast<int64_t>(o.shutdown_grace_s * 1000)));
  http_thread.join();  // every connection's handler has returned
  std::fprintf(stderr, "xmoe serve: stopped\n");
  return 0;
}

}  // namespace xmoe::app
