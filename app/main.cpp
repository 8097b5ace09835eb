// The xmoe command line.
#include <omp.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>

#include "a2a_bench.hpp"
#include "bench.hpp"
#include "cli_checks.hpp"
#include "generate_cmd.hpp"
#include "init_model_cmd.hpp"
#include "kernels/cpu_features.hpp"
#include "linear_bench_cmd.hpp"
#include "openmp_wait.hpp"
#include "quantize_cmd.hpp"
#include "reshard_cmd.hpp"
#include "serve_cmd.hpp"
#include "xmoe/error.hpp"

namespace {

void add_bench_flags(CLI::App& cmd, xmoe::app::BenchOptions& o) {
  const CLI::Validator positive = xmoe::app::positive_integer();
  cmd.add_option("--batch_size", o.batch_size, "sequences per step")->check(positive)->capture_default_str();
  cmd.add_option("--num_tokens", o.num_tokens, "tokens per sequence")->check(positive)->capture_default_str();
  cmd.add_option("--model_dim", o.model_dim, "model dimension M")->check(positive)->capture_default_str();
  cmd.add_option("--hidden_size", o.hidden_size, "expert hidden size H")
      ->check(positive)
      ->capture_default_str();
  cmd.add_option("--num_local_experts", o.num_local_experts,
                 "experts per rank; negative -n: one expert per n ranks (hidden-sharded), as in Tutel")
      ->capture_default_str();  // run_bench checks it against the number of ranks
  cmd.add_option("--top", o.top, "top-k")->check(positive)->capture_default_str();
  cmd.add_option("--capacity_factor", o.capacity_factor, ">0 padded, 0 dropless, <0 capped dropless")
      ->capture_default_str();
  cmd.add_option("--dtype", o.dtype, "float32 | bfloat16 | float64")
      ->check(CLI::IsMember({"float32", "bfloat16", "float64"}))
      ->capture_default_str();
  cmd.add_flag("--eval", o.eval, "forward only");
  cmd.add_option("--num_steps", o.num_steps, "steps (the first is warm-up)")
      ->check(positive)
      ->capture_default_str();
  cmd.add_flag("--dropless", o.dropless, "capacity_factor 0 with grouped execution (no padded rows)");
  cmd.add_option("--expert_type", o.expert_type, "ffn | swiglu")
      ->check(CLI::IsMember({"ffn", "swiglu"}))
      ->capture_default_str();
  cmd.add_option("--activation", o.activation, "ffn activation: relu | gelu | silu")
      ->check(CLI::IsMember({"relu", "gelu", "silu"}))
      ->capture_default_str();
  cmd.add_option("--gate_type", o.gate_type, "top | cosine_top")
      ->check(CLI::IsMember({"top", "cosine_top"}))
      ->capture_default_str();
  cmd.add_option("--gate_noise", o.gate_noise, "gate noise (training)")
      ->check(xmoe::app::non_negative_number());
  cmd.add_option("--l_aux_wt", o.l_aux_wt, "aux loss weight")->capture_default_str();
  cmd.add_option("--lr", o.lr, "learning rate")->capture_default_str();
  cmd.add_option("--optimizer", o.optimizer, "sgd | adam (betas 0.9, 0.999, eps 1e-8, as torch.optim.Adam)")
      ->check(CLI::IsMember({"sgd", "adam"}))
      ->capture_default_str();
  cmd.add_option("--threads", o.threads, "OpenMP threads (0 = default)")
      ->check(xmoe::app::non_negative_number());
  cmd.add_option("--isa", o.isa, "kernel level: reference | avx2 | avx512 | avx512_bf16 (default: best)")
      ->check(CLI::IsMember({"reference", "avx2", "avx512", "avx512_bf16", "amx"}));
  cmd.add_flag("--measure_switching", o.measure_switching,
               "also time forwards that switch top_k/capacity_factor every call against unswitched ones");
  cmd.add_option("--seed", o.seed, "input seed")->capture_default_str();
  cmd.add_option("--parallel_type", o.parallel_type,
                 "under mpirun: adaptive:R (R = 0 data, 1 expert parallel, sc expert + model) | data | model")
      ->capture_default_str();
  cmd.add_option(
         "--adaptive_r", o.adaptive_r,
         "under mpirun: 0 = data parallel experts, 1 = expert parallel, up to sc (ranks per expert) = "
         "expert + model parallel; 0 or a divisor of sc")
      ->check(CLI::NonNegativeNumber);
  cmd.add_option("--a2a_overlap_degree", o.a2a_overlap_degree,
                 "under mpirun: capacity chunks overlapping a2a")
      ->check(positive)
      ->capture_default_str();
  cmd.add_flag("--use_2dh", o.use_2dh, "under mpirun: hierarchical all-to-all (nodes of --local_size ranks)");
  cmd.add_option("--local_size", o.local_size, "ranks per node for --use_2dh (default: LOCAL_SIZE env)")
      ->check(positive);
}

}  // namespace

int main(int argc, char** argv) {
  xmoe::app::use_default_openmp_wait(argv);
  CLI::App app{"xmoe: Mixture-of-Experts runtime"};
  app.require_subcommand(1);
  xmoe::app::BenchOptions bench;
  CLI::App* bench_cmd =
      app.add_subcommand("bench", "Tutel helloworld: train or eval steps of a one-layer MoE model");
  add_bench_flags(*bench_cmd, bench);
  CLI::App* info_cmd = app.add_subcommand("info", "CPU features and the kernel level xmoe would use");
  xmoe::app::A2aBenchOptions a2a_bench;
  CLI::App* a2a_bench_cmd = xmoe::app::add_a2a_bench_subcommand(app, a2a_bench);
  xmoe::app::ReshardOptions reshard;
  CLI::App* reshard_cmd = xmoe::app::add_reshard_subcommand(app, reshard);
  xmoe::app::InitModelOptions init_model;
  CLI::App* init_model_cmd = xmoe::app::add_init_model_subcommand(app, init_model);
  xmoe::app::GenerateOptions generate;
  CLI::App* generate_cmd = xmoe::app::add_generate_subcommand(app, generate);
  xmoe::app::LinearBenchOptions linear_bench;
  CLI::App* linear_bench_cmd = xmoe::app::add_linear_bench_subcommand(app, linear_bench);
  xmoe::app::QuantizeOptions quantize;
  CLI::App* quantize_cmd = xmoe::app::add_quantize_subcommand(app, quantize);
  xmoe::app::ServeOptions serve;
  CLI::App* serve_cmd = xmoe::app::add_serve_subcommand(app, serve);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "xmoe: %s\n", e.what());
    return 2;
  }
  try {
    if (info_cmd->parsed()) {
      const auto f = xmoe::kernels::detect_cpu_features();
      std::printf(
          "cpu features: %s\n"
          "cpu vendor: %s\n"
          "L2 per core: %lld KiB\n"
          "kernel level: %s\n"
          "openmp threads: %d\n"
          "openmp wait: %s\n",
          f.str().c_str(), f.amd ? "AMD" : "not AMD", static_cast<long long>(f.l2_bytes / 1024),
          xmoe::kernels::isa_name(xmoe::kernels::best_isa(f)), omp_get_max_threads(),
          xmoe::app::openmp_wait_description().c_str());
      return 0;
    }
    if (reshard_cmd->parsed()) return xmoe::app::run_reshard(reshard);
    if (init_model_cmd->parsed()) return xmoe::app::run_init_model(init_model);
    if (generate_cmd->parsed()) return xmoe::app::run_generate(generate);
    if (quantize_cmd->parsed()) return xmoe::app::run_quantize(quantize);
    if (linear_bench_cmd->parsed()) return xmoe::app::run_linear_bench(linear_bench);
    if (serve_cmd->parsed()) return xmoe::app::run_serve(serve);
    if (a2a_bench_cmd->parsed()) return xmoe::app::run_a2a_bench(a2a_bench);
    return xmoe::app::run_bench(bench);
  } catch (const xmoe::Error& e) {
    std::fprintf(stderr, "xmoe: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "xmoe: internal error: %s\n", e.what());
    return 1;
  }
}
