#include "generate_cmd.hpp"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>

#include "cli_checks.hpp"
#include "kernels/cpu_features.hpp"
#include "kernels/read_bandwidth.hpp"
#include "kernels/register_fma_peak.hpp"
#include "llm/engine.hpp"
#include "llm/model_bundle.hpp"
#include "llm/step_profile.hpp"
#include "matmul_precision_option.hpp"
#include "prefault_option.hpp"
#include "prefill_flops.hpp"
#include "process_memory.hpp"
#include "serve/chat_request.hpp"
#include "serve/output_parser.hpp"
#include "step_bandwidth.hpp"
#include "weight_copies.hpp"
#include "xmoe/error.hpp"
#include "xmoe/tokenizer.hpp"

namespace xmoe::app {

CLI::App* add_generate_subcommand(CLI::App& app, GenerateOptions& o) {
  CLI::App* cmd = app.add_subcommand("generate", "Generate text with a Hugging Face MoE checkpoint");
  const CLI::Validator positive = positive_integer();
  const CLI::Validator non_negative = non_negative_number();
  cmd->add_option("--model", o.model, "checkpoint directory (config.json, safetensors, tokenizer.json)")
      ->required();
  // Each occurrence is one prompt (one sequence): a prompt's words are not separate values.
  CLI::Option* prompt = cmd->add_option("--prompt", o.prompts, "prompt text (repeatable: one sequence each)")
                            ->allow_extra_args(false);
  CLI::Option* prompt_ids =
      cmd->add_option("--prompt-ids", o.prompt_ids, "prompt token ids, e.g. 1,2,3 (repeatable)")
          ->allow_extra_args(false);
  CLI::Option* prompts_file =
      cmd->add_option("--prompts-file", o.prompts_file, "text prompts, one per line (one sequence each)")
          ->check(CLI::ExistingFile);
  prompt_ids->excludes(prompt)->excludes(prompts_file);
  cmd->add_flag("--chat", o.chat, "apply the checkpoint's chat template to --prompt (as the user message)");
  o.system_opt = cmd->add_option("--system", o.system, "system message (with --chat)");
  cmd->add_flag("--no-think", o.no_think, "chat template with enable_thinking=false");
  cmd->add_flag("--show-reasoning", o.show_reasoning,
                "with --chat: also print the model's reasoning (thinking / harmony analysis), on stderr");
  cmd->add_option("--max-tokens", o.max_tokens, "tokens to generate at most")
      ->check(positive)
      ->capture_default_str();
  o.temperature_opt = cmd->add_option("--temperature", o.temperature,
                                      "0 = greedy (default: generation_config.json, "
                                      "else 1)")
                          ->check(non_negative);
  o.top_k_opt = cmd->add_option("--top-k", o.top_k, "keep the k most likely tokens (0 = off)")
                    ->check(non_negative_integer());
  o.top_p_opt = cmd->add_option("--top-p", o.top_p, "nucleus sampling, in (0, 1]");
  o.min_p_opt =
      cmd->add_option("--min-p", o.min_p, "drop tokens below min_p x the top probability, in [0, 1]");
  o.repetition_opt = cmd->add_option("--repetition-penalty", o.repetition_penalty,
                                     "HF repetition penalty over prompt and output (> 0, 1 = off)");
  cmd->add_option("--presence-penalty", o.presence_penalty, "OpenAI presence penalty over generated tokens");
  cmd->add_option("--frequency-penalty", o.frequency_penalty,
                  "OpenAI frequency penalty over generated tokens");
  o.seed_opt = cmd->add_option("--seed", o.seed, "sampling seed (sequence i uses seed + i)");
  cmd->add_option("--stop", o.stop, "stop string (repeatable); not included in the output");
  cmd->add_option("--stop-id", o.stop_ids, "stop token id (repeatable), in addition to the model's eos");
  cmd->add_flag("--ignore-eos", o.ignore_eos, "do not stop at eos (decode exactly --max-tokens)");
  cmd->add_option("--dtype", o.dtype, "weights and activations: bf16 | f32")
      ->check(CLI::IsMember({"bf16", "f32"}))
      ->capture_default_str();
  cmd->add_option("--isa", o.isa, "kernel level cap: reference | avx2 | avx512 | avx512_bf16 (default: best)")
      ->check(CLI::IsMember({"reference", "avx2", "avx512", "avx512_bf16", "amx"}));
  add_matmul_precision_option(cmd, o.matmul_precision);
  add_prefault_option(cmd, o.prefault);
  add_page_cache_option(cmd, o.page_cache);
  cmd->add_option("--threads", o.threads, "OpenMP threads (0 = default)")->check(non_negative_integer());
  o.batch_opt = cmd->add_option("--batch", o.batch,
                                "N concurrent sequences, sequence i from prompt i mod the number of prompts "
                                "(default: one per prompt)")
                    ->check(positive);
  cmd->add_option("--kv-cache-mb", o.kv_cache_mb, "KV cache budget in MiB")
      ->check(positive)
      ->capture_default_str();
  cmd->add_option("--prefill-chunk", o.prefill_chunk, "tokens fed to the model per step (prefill chunk)")
      ->check(positive)
      ->capture_default_str();
  cmd->add_flag("--no-stream", o.no_stream, "print the text once generation ends");
  cmd->add_flag("--warmup", o.warmup,
                "run the requests once (two tokens each) before the timed run, so the weights are paged in");
  cmd->add_flag("--print-ids", o.print_ids, "also print the generated token ids to stderr");
  cmd->add_flag(
      "--measure-bandwidth", o.measure_bandwidth,
      "measure the machine's read bandwidth and register-only FMA peak and report decode's share of "
      "the one, prefill's of the other");
  cmd->add_flag("--profile", o.profile,
                "print where prefill and decode steps spend their time, by op class (share, ms per step, "
                "GB/s, GFLOP/s, threads busy; set OMP_WAIT_POLICY=passive for the barrier cost)");
  return cmd;
}

namespace {

// Median cost of one empty parallel region of the default team (fork, join, the implicit barrier).
double fork_join_microseconds() {
  constexpr int kRounds = 9, kRegions = 200;
  std::vector<double> us;
  for (int r = 0; r < kRounds; ++r) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kRegions; ++i) {
#pragma omp parallel
      {
        // An empty region could be elided; a relaxed read keeps it a real fork/join.
        [[maybe_unused]] volatile int thread = omp_get_thread_num();
      }
    }
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() /
                 kRegions);
  }
  std::nth_element(us.begin(), us.begin() + kRounds / 2, us.end());
  return us[kRounds / 2];
}

std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t comma = std::min(text.find(',', pos), text.size());
    std::string item = text.substr(pos, comma - pos);
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    long long v = -1;
    size_t used = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    XMOE_CHECK(used == item.size() && !item.empty() && v >= 0 && v <= INT32_MAX, "--prompt-ids: '", item,
               "' is not a token id (comma-separated non-negative integers expected)");
    ids.push_back(static_cast<int32_t>(v));
    pos = comma + 1;
  }
  return ids;
}

std::string join_ids(const std::vector<int32_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(ids[i]);
  }
  return s;
}

double per_second(double count, double seconds) {
  return seconds > 0 ? count / seconds : 0.0;
}

// The prompts of --prompts-file: one per line (a trailing \r dropped); a blank line is an error, not an empty
// prompt.
std::vector<std::string> read_prompt_lines(const std::string& path) {
  std::ifstream in(path);
  XMOE_CHECK(in.good(), "--prompts-file: cannot read ", path);
  std::vector<std::string> lines;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    XMOE_CHECK(line.find_first_not_of(" \t") != std::string::npos, "--prompts-file ", path, ": line ", number,
               " is blank (one prompt per line)");
    lines.push_back(line);
  }
  XMOE_CHECK(!lines.empty(), "--prompts-file ", path, ": no prompts");
  return lines;
}

// The kernel level the model runs: the best this CPU has, capped by --isa.
kernels::Isa model_isa(const kernels::CpuFeatures& features, const std::string& isa_cap) {
  const kernels::Isa best = kernels::best_isa(features);
  return isa_cap.empty() ? best : std::min(best, kernels::parse_isa(isa_cap));
}

// Whether the BF16 linears run bf16 products (medium on a level that has them: VDPBF16PS, or AMX tiles at the
// AMX level) rather than f32 FMAs.
bool runs_bf16_dot(const std::string& isa_cap, kernels::MatmulPrecision precision) {
  return precision == kernels::MatmulPrecision::medium &&
         model_isa(kernels::detect_cpu_features(), isa_cap) >= kernels::Isa::avx512_bf16;
}
// The f32 FMA chains' peak of the kernel level, the ceiling the compute goals are stated against.
double f32_fma_peak(const std::string& isa_cap) {
  const kernels::CpuFeatures features = kernels::detect_cpu_features();
  return kernels::register_fma_peak_gflops(model_isa(features, isa_cap), features, omp_get_max_threads());
}
// The register-only peak of the arithmetic the model's linears run, on all OpenMP threads: the level's bf16
// products at medium (TDPBF16PS tiles on AMX, VDPBF16PS chains on AVX512-BF16), else f32 FMA chains.
double compute_peak(const std::string& isa_cap, kernels::MatmulPrecision precision) {
  const kernels::CpuFeatures features = kernels::detect_cpu_features();
  if (runs_bf16_dot(isa_cap, precision))
    return kernels::register_bf16_product_peak_gflops(model_isa(features, isa_cap), features,
                                                      omp_get_max_threads());
  return f32_fma_peak(isa_cap);
}

const char* peak_name(const std::string& isa_cap, kernels::MatmulPrecision precision) {
  if (!runs_bf16_dot(isa_cap, precision)) return "FMA";
  return kernels::bf16_product_peak_name(model_isa(kernels::detect_cpu_features(), isa_cap));
}

// /proc/loadavg's first three fields ("?" where it cannot be read): the machine may be shared.
std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string one, five, fifteen;
  if (!(in >> one >> five >> fifteen)) return "?";
  return one + " " + five + " " + fifteen;
}

// The checkpoint's largest tensor (the lm_head or the embeddings at these sizes) when it is big enough for
// the read probe (64 MiB).
std::optional<llm::WeightView> largest_tensor(const llm::Checkpoint& checkpoint) {
  std::optional<llm::WeightView> best;
  for (const std::string& name : checkpoint.tensor_names()) {
    llm::WeightView v;
    try {
      v = checkpoint.weight(name);
    } catch (const Error&) {
      continue;  // a dtype the loader does not read: not a weight the decode streams either
    }
    if (v.bytes.size() >= (size_t{64} << 20) && (!best || v.bytes.size() > best->bytes.size()))
      best = std::move(v);
  }
  return best;
}

}  // namespace

int run_generate(const GenerateOptions& o) {
  std::vector<std::string> texts = o.prompts;
  if (!o.prompts_file.empty()) {
    std::vector<std::string> lines = read_prompt_lines(o.prompts_file);
    texts.insert(texts.end(), lines.begin(), lines.end());
  }
  const size_t prompt_count = texts.size() + o.prompt_ids.size();
  XMOE_CHECK(prompt_count > 0, "generate: give a prompt: --prompt, --prompt-ids or --prompts-file");
  XMOE_CHECK(!o.chat || o.prompt_ids.empty(), "generate: --chat needs --prompt (text)");
  const int sequences = o.batch_opt->count() ? o.batch : static_cast<int>(prompt_count);
  XMOE_CHECK(static_cast<size_t>(sequences) >= prompt_count, "generate: --batch ", o.batch,
             " is fewer sequences than the ", prompt_count, " prompts given");
  XMOE_CHECK(o.chat || (o.system_opt->count() == 0 && !o.no_think && !o.show_reasoning),
             "generate: --system, --no-think and --show-reasoning need --chat");
  if (o.threads > 0) omp_set_num_threads(o.threads);

  const auto load_start = std::chrono::steady_clock::now();
  llm::ModelBundle bundle = llm::ModelBundle::open(o.model);
  const std::optional<Tokenizer>& tokenizer = bundle.tokenizer;
  if (!texts.empty()) bundle.require_tokenizer("--prompt (give --prompt-ids instead)");
  if (!o.stop.empty()) bundle.require_tokenizer("--stop");
  const llm::ChatSetup& setup = bundle.chat;
  const llm::Checkpoint& checkpoint = bundle.checkpoint;

  std::vector<std::vector<int32_t>> prompts;
  // Per prompt: the chat template left the reply inside a thinking block (it ends with "<think>"), so the
  // output parser starts there, as the server's does.
  std::vector<bool> opens_thinking;
  for (const std::string& text : texts) {
    if (o.chat) {
      llm::ChatPromptOptions chat;
      if (o.system_opt->count()) chat.system = o.system;
      chat.user = text;
      if (o.no_think) chat.enable_thinking = false;
      const std::string rendered = llm::render_chat_prompt(setup, chat);
      opens_thinking.push_back(serve::prompt_opens_thinking(rendered));
      prompts.push_back(tokenizer->encode(rendered, /*add_special_tokens=*/false));
    } else {
      prompts.push_back(tokenizer->encode(text, /*add_special_tokens=*/true));
    }
  }
  for (const std::string& ids : o.prompt_ids) prompts.push_back(parse_ids(ids));

  llm::SamplingParams sampling;
  llm::apply_generation_defaults(setup, sampling);
  if (o.temperature_opt->count()) sampling.temperature = o.temperature;
  if (o.top_k_opt->count()) sampling.top_k = o.top_k;
  if (o.top_p_opt->count()) sampling.top_p = o.top_p;
  if (o.min_p_opt->count()) sampling.min_p = o.min_p;
  if (o.repetition_opt->count()) sampling.repetition_penalty = o.repetition_penalty;
  sampling.presence_penalty = o.presence_penalty;
  sampling.frequency_penalty = o.frequency_penalty;
  sampling.validate();

  const DType dtype = parse_dtype(o.dtype);
  const kernels::MatmulPrecision precision = effective_matmul_precision(o.matmul_precision, o.isa, dtype);
  const llm::PrefaultMode prefault_mode = llm::parse_prefault_mode(o.prefault);
  bundle.load_weights(dtype, o.isa, precision, prefault_mode, llm::parse_page_cache_mode(o.page_cache));
  if (bundle.prefault.worth_saying(prefault_mode))
    std::fprintf(stderr, "%s\n", bundle.prefault.summary().c_str());
  const std::unique_ptr<llm::CausalLM>& model = bundle.model;
  // Opening the checkpoint and building the model (tokenizer and template reading included, both small).
  const double load_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();
  const ResidentMemory after_load = resident_memory();

  llm::EngineOptions engine_options;
  engine_options.kv_cache_bytes = static_cast<size_t>(o.kv_cache_mb) << 20;
  engine_options.max_step_tokens = std::max<int64_t>(o.prefill_chunk, sequences);
  engine_options.max_running = sequences;
  engine_options.eos_token_ids = setup.eos_token_ids;
  // A chat's output goes through the template's output parser (one per sequence): the answer on stdout, the
  // reasoning on stderr with --show-reasoning (harmony's channel markup and some families' thinking and tool
  // markers are special tokens, which the parser must see).
  const serve::OutputFormat format =
      o.chat ? serve::detect_output_format(setup, checkpoint.config()) : serve::OutputFormat::plain;
  // For sequence i (prompt i mod the number of prompts).
  const auto make_parser = [&](int i) -> std::unique_ptr<serve::OutputParser> {
    if (!o.chat) return nullptr;
    serve::OutputParserOptions parser_options;
    parser_options.parse_tools = false;
    parser_options.starts_in_thinking = opens_thinking[static_cast<size_t>(i) % opens_thinking.size()];
    return serve::make_output_parser(format, parser_options);
  };
  std::vector<serve::OutputEvent> events;
  const auto print_text = [&](serve::OutputParser* parser, std::string_view text, bool last) {
    if (!parser) {
      std::fwrite(text.data(), 1, text.size(), stdout);
      return;
    }
    parser->push(text, events);
    if (last) parser->finish(events);
    for (const serve::OutputEvent& e : events) {
      if (e.kind == serve::OutputEvent::Kind::text) std::fwrite(e.text.data(), 1, e.text.size(), stdout);
      if (e.kind == serve::OutputEvent::Kind::thinking && o.show_reasoning)
        std::fwrite(e.text.data(), 1, e.text.size(), stderr);
    }
    events.clear();
  };
  std::unique_ptr<serve::OutputParser> stream_parser = make_parser(0);
  if (tokenizer)
    engine_options.text_stream =
        llm::tokenizer_text_stream(*tokenizer, !(o.chat && serve::output_format_uses_special_tokens(format)));
  // Sequence i: prompt i mod the number of prompts, seed + i.
  const auto make_request = [&](int i) {
    llm::GenerationRequest request;
    request.prompt = prompts[static_cast<size_t>(i) % prompts.size()];
    request.sampling = sampling;
    if (o.seed_opt->count()) request.sampling.seed = o.seed + static_cast<uint64_t>(i);
    request.max_tokens = o.max_tokens;
    request.stop_strings = o.stop;
    request.stop_token_ids = o.stop_ids;
    request.ignore_eos = o.ignore_eos;
    return request;
  };
  if (o.warmup) {
    // The same requests, two tokens each, through an engine of their own: the weights they touch are paged
    // in and warm in the caches before the timed run, which then starts from an empty KV cache.
    llm::Engine warm(*model, engine_options);
    for (int i = 0; i < sequences; ++i) {
      llm::GenerationRequest request = make_request(i);
      request.max_tokens = std::min<int64_t>(request.max_tokens, 2);
      warm.submit(std::move(request));
    }
    warm.run_until_idle();
  }
  llm::StepProfile profile;
  if (o.profile) engine_options.profile = &profile;
  llm::Engine engine(*model, engine_options);
  std::vector<llm::RequestId> ids;
  int64_t prompt_tokens = 0;
  double flops = 0;  // of all prefills
  for (int i = 0; i < sequences; ++i) {
    llm::GenerationRequest request = make_request(i);
    prompt_tokens += static_cast<int64_t>(request.prompt.size());
    flops += prefill_flops(checkpoint.config(), static_cast<int64_t>(request.prompt.size()));
    if (sequences == 1 && !o.no_stream) {
      request.on_delta = [&tokenizer, &print_text, &stream_parser](const llm::StreamDelta& d) {
        if (tokenizer) {
          print_text(stream_parser.get(), d.text, d.finish != llm::FinishReason::none);
        } else {
          for (int32_t t : d.token_ids) std::printf("%d ", t);
        }
        std::fflush(stdout);
      };
    }
    ids.push_back(engine.submit(std::move(request)));
  }
  // The machine is shared and its bandwidth drifts: the probe runs right before and right after the run, and
  // the higher of the two is the baseline (the conservative share).
  // Run-queue waits (and the hypervisor's steal) show whether another process shared the CPUs with the probe
  // or with the run: a share is only comparable with another run's when neither waited.
  // The probe's fresh anonymous buffer lands on other physical pages each time, and on this VM some pages
  // stream ~20 % slower than others (a buffer keeps its rate; buffers differ): the probe also streams the
  // largest mapped tensor, page-cache pages as the decode reads, and the share is of the highest rate.
  const std::optional<llm::WeightView> mapped =
      o.measure_bandwidth ? largest_tensor(checkpoint) : std::optional<llm::WeightView>{};
  const auto probe_mapped = [&mapped] {
    return mapped ? kernels::measure_read_bandwidth_gbs(mapped->bytes.data(), mapped->bytes.size()) : 0.0;
  };
  const double wait_probe0 = o.measure_bandwidth ? kernels::process_runqueue_wait_seconds() : 0.0;
  const double probe_before = o.measure_bandwidth ? kernels::measure_read_bandwidth_gbs() : 0.0;
  const double mapped_before = o.measure_bandwidth ? probe_mapped() : 0.0;
  const double peak_before = o.measure_bandwidth ? compute_peak(o.isa, precision) : 0.0;
  const double wait_run0 = o.measure_bandwidth ? kernels::process_runqueue_wait_seconds() : 0.0;
  const double steal_run0 = o.measure_bandwidth ? kernels::machine_steal_seconds() : 0.0;
  // And a short probe between steps, each decode step compared with the probes right beside it (the
  // bandwidth moves within seconds on a shared host); their time is not the run's.
  std::optional<kernels::ReadProbe> step_probe;
  if (o.measure_bandwidth) step_probe.emplace(stream_bytes_beyond_caches(size_t{128} << 20));
  std::vector<DecodeStepSample> decode_samples;
  double probe_seconds = 0;
  const auto timed_probe = [&] {
    const auto t0 = std::chrono::steady_clock::now();
    const double gbs = step_probe->measure();
    probe_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return gbs;
  };
  double probe_before_step = step_probe ? step_probe->measure() : 0.0;  // before the run's clock starts
  const auto start = std::chrono::steady_clock::now();
  if (!step_probe) {
    engine.run_until_idle();
  } else {
    for (llm::EngineStats before = engine.stats(); engine.step(); before = engine.stats()) {
      const llm::EngineStats& after = engine.stats();
      const double probe_after_step = timed_probe();
      if (after.decode_steps > before.decode_steps)
        decode_samples.push_back({static_cast<double>(after.decode_weight_bytes - before.decode_weight_bytes),
                                  after.decode_seconds - before.decode_seconds,
                                  std::max(probe_before_step, probe_after_step)});
      probe_before_step = probe_after_step;
    }
  }
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() - probe_seconds;
  const double wait_run1 = o.measure_bandwidth ? kernels::process_runqueue_wait_seconds() : 0.0;
  const double steal_run1 = o.measure_bandwidth ? kernels::machine_steal_seconds() : 0.0;

  std::vector<llm::GenerationResult> results;
  for (llm::RequestId id : ids) results.push_back(engine.take_result(id));
  const llm::GenerationResult& first = results.front();
  const auto print_output = [&](const llm::GenerationResult& r, int i) {
    if (tokenizer) {
      std::unique_ptr<serve::OutputParser> parser = make_parser(i);
      print_text(parser.get(), r.text, true);
    } else {
      for (int32_t t : r.token_ids) std::printf("%d ", t);
    }
  };
  if (sequences == 1) {
    if (o.no_stream) print_output(first, 0);
    std::printf("\n");
  } else {
    for (size_t i = 0; i < results.size(); ++i) {
      const llm::GenerationResult& r = results[i];
      std::printf("--- sequence %zu (prompt %zu, %zu tokens, finish %s) ---\n", i, i % prompts.size(),
                  r.token_ids.size(), llm::finish_reason_name(r.finish));
      print_output(r, static_cast<int>(i));
      std::printf("\n");
    }
  }
  std::fflush(stdout);

  const llm::EngineStats& st = engine.stats();
  int64_t generated = 0;
  for (const auto& r : results) generated += static_cast<int64_t>(r.token_ids.size());
  std::fprintf(stderr, "model: %s (%s, %s, matmul precision %s, %d threads); ", o.model.c_str(),
               bundle.checkpoint.config().architecture.c_str(), dtype_name(model->dtype()),
               kernels::matmul_precision_name(precision), omp_get_max_threads());
  if (prompts.size() == 1) {
    std::fprintf(stderr, "prompt %zu tokens x %d sequences\n", prompts[0].size(), sequences);
  } else {
    std::fprintf(stderr, "%zu prompts, %lld tokens in all, %d sequences\n", prompts.size(),
                 static_cast<long long>(prompt_tokens), sequences);
  }
  std::fprintf(stderr, "finish: %s after %zu tokens%s%s; %lld tokens generated in all in %.3f s\n",
               llm::finish_reason_name(first.finish), first.token_ids.size(),
               first.stop_string.empty() ? "" : " at stop string ", first.stop_string.c_str(),
               static_cast<long long>(generated), wall);
  if (o.print_ids) {
    if (sequences == 1) std::fprintf(stderr, "generated ids: %s\n", join_ids(first.token_ids).c_str());
    for (size_t i = 0; sequences > 1 && i < results.size(); ++i)
      std::fprintf(stderr, "sequence %zu generated ids: %s\n", i, join_ids(results[i].token_ids).c_str());
  }
  std::fprintf(stderr, "prefill: %lld tokens in %.3f s = %.2f tokens/s\n",
               static_cast<long long>(st.prefill_tokens), st.prefill_seconds,
               per_second(static_cast<double>(st.prefill_tokens), st.prefill_seconds));
  double compute_peak_gflops = 0;     // with --measure-bandwidth
  llm::ProfileLimits profile_limits;  // with --measure-bandwidth: what --profile's bound holds each op to
  if (o.measure_bandwidth) {
    // The peak is probed before and after the run; the higher is the baseline (the conservative share).
    compute_peak_gflops = std::max(peak_before, compute_peak(o.isa, precision));
    const double peak = compute_peak_gflops;
    const double gflops = per_second(flops, st.prefill_seconds) / 1e9;
    // bf16 products run above the f32 FMA rate: their rate against it too (the compute goals' ceiling).
    std::string versus_fma;
    if (runs_bf16_dot(o.isa, precision)) {
      const double fma = f32_fma_peak(o.isa);
      char text[96];
      std::snprintf(text, sizeof(text), "; %.2f x the register-only f32 FMA peak %.1f GFLOP/s", gflops / fma,
                    fma);
      versus_fma = text;
    }
    std::fprintf(
        stderr,
        "prefill compute: %.1f GFLOP in all, %.1f GFLOP/s = %.1f %% of the register-only %s peak %.1f "
        "GFLOP/s (%d threads)%s%s\n",
        flops / 1e9, gflops, 100.0 * gflops / peak, peak_name(o.isa, precision), peak, omp_get_max_threads(),
        versus_fma.c_str(), st.preemptions > 0 ? " (preemptions recomputed tokens: not counted)" : "");
  }
  const double decode_rate = per_second(static_cast<double>(st.decode_tokens), st.decode_seconds);
  if (sequences > 1) {
    std::fprintf(stderr,
                 "decode: %lld tokens in %lld steps, %.3f s = %.2f tokens/s aggregate (%.2f tokens/s per "
                 "sequence)\n",
                 static_cast<long long>(st.decode_tokens), static_cast<long long>(st.decode_steps),
                 st.decode_seconds, decode_rate, decode_rate / sequences);
  } else {
    std::fprintf(stderr, "decode: %lld tokens in %.3f s = %.2f tokens/s\n",
                 static_cast<long long>(st.decode_tokens), st.decode_seconds, decode_rate);
  }
  if (st.preemptions > 0)
    std::fprintf(stderr, "kv cache: %lld preemptions (raise --kv-cache-mb)\n",
                 static_cast<long long>(st.preemptions));
  // A decode step reads the weights once for the whole batch, and each MoE layer's experts that any of its
  // sequences chose once: the model counts what it read.
  const double step_bytes =
      st.decode_steps > 0 ? static_cast<double>(st.decode_weight_bytes) / static_cast<double>(st.decode_steps)
                          : 0.0;
  const double gbs = per_second(static_cast<double>(st.decode_weight_bytes), st.decode_seconds) / 1e9;
  if (sequences > 1) {
    std::fprintf(
        stderr,
        "weights read per decode step: %.2f MB (%.2f MB at batch 1); decode weight bandwidth: %.2f GB/s",
        step_bytes / 1e6, static_cast<double>(model->weight_bytes_per_token()) / 1e6, gbs);
  } else {
    std::fprintf(stderr, "weights read per decoded token: %.2f MB; decode weight bandwidth: %.2f GB/s",
                 step_bytes / 1e6, gbs);
  }
  if (o.measure_bandwidth) {
    const double wait_probe2 = kernels::process_runqueue_wait_seconds();
    const double probe_after = kernels::measure_read_bandwidth_gbs();
    const double mapped_after = probe_mapped();
    const double wait_probe3 = kernels::process_runqueue_wait_seconds();
    const double peak = std::max({probe_before, probe_after, mapped_before, mapped_after});
    std::fprintf(stderr,
                 " = %.1f %% of the measured read bandwidth %.2f GB/s (probed %.2f before, %.2f after",
                 100.0 * gbs / peak, peak, probe_before, probe_after);
    if (mapped)
      std::fprintf(stderr, "; over the mapped %s (%.0f MB) %.2f before, %.2f after", mapped->name.c_str(),
                   static_cast<double>(mapped->bytes.size()) / 1e6, mapped_before, mapped_after);
    std::fprintf(stderr, ")");
    if (wait_probe0 >= 0 && wait_probe3 >= 0) {
      const double ms_run = 1e3 * (wait_run1 - wait_run0);
      std::fprintf(
          stderr,
          "\ncpu contention: threads waited for a CPU %.1f ms in the run (%.1f %% of %d threads x "
          "%.3f s), %.1f ms in the probe before, %.1f ms in the probe after; hypervisor steal %.2f s",
          ms_run, 100.0 * ms_run / 1e3 / (wall * omp_get_max_threads()), omp_get_max_threads(), wall,
          1e3 * (wait_run0 - wait_probe0), 1e3 * (wait_probe3 - wait_probe2),
          steal_run0 >= 0 && steal_run1 >= 0 ? steal_run1 - steal_run0 : 0.0);
    }
    // The roofline: every step bound by reading its bytes at the probed bandwidth.
    if (step_bytes > 0)
      std::fprintf(stderr,
                   "\ndecode roofline: %.2f tokens/s aggregate (%d sequences x %.2f steps/s at %.2f MB "
                   "per step); achieved %.1f %% of it",
                   sequences * peak * 1e9 / step_bytes, sequences, peak * 1e9 / step_bytes, step_bytes / 1e6,
                   100.0 * decode_rate / (sequences * peak * 1e9 / step_bytes));
    const StepBandwidth between = summarize_steps(decode_samples);
    // The profile's bound holds each op to the bandwidth the steps met (the probes between them where taken).
    profile_limits = {between.steps > 0 ? between.probe_median : peak, compute_peak_gflops,
                      peak_name(o.isa, precision)};
    if (between.steps > 0)
      std::fprintf(
          stderr,
          "\ndecode against a read probe between steps (%d steps; probes %.2f-%.2f GB/s, median %.2f): "
          "%.1f %% of the roofline at the probes beside each step (per step: median %.1f %%, "
          "quartiles %.1f-%.1f %%)",
          between.steps, between.probe_min, between.probe_max, between.probe_median, 100.0 * between.share,
          100.0 * between.share_median, 100.0 * between.share_low, 100.0 * between.share_high);
    // The compute ceiling: every step bound by its multiply-adds (a token's worth per sequence, from the
    // config) at the register-only peak of the arithmetic the linears run; the lower ceiling binds.
    const double step_flops = sequences * prefill_flops(checkpoint.config(), 1);
    const double compute_roof = sequences * compute_peak_gflops * 1e9 / step_flops;
    const double bandwidth_roof = sequences * peak * 1e9 / step_bytes;
    if (step_bytes > 0)
      std::fprintf(
          stderr,
          "\ndecode compute ceiling: %.2f tokens/s aggregate (%.2f GFLOP per step at the register-only "
          "%s peak %.1f GFLOP/s); %s binds",
          compute_roof, step_flops / 1e9, peak_name(o.isa, precision), compute_peak_gflops,
          compute_roof < bandwidth_roof ? "compute" : "bandwidth");
  }
  std::fprintf(stderr, "\n");
  if (o.profile)
    std::fprintf(stderr, "%s",
                 profile.report(omp_get_max_threads(), fork_join_microseconds(), profile_limits).c_str());
  if (o.measure_bandwidth) {
    // What a token of context costs in the cache (MLA: the latent vector only).
    const llm::KvCache& kv = engine.kv_cache();
    std::fprintf(stderr, "kv cache: %zu bytes per token (%d layers, %s)\n", kv.bytes_per_token(),
                 kv.shape().num_layers, dtype_name(kv.dtype()));
    std::fprintf(stderr, "load average (1, 5, 15 min): %s\n", load_average().c_str());
    // Weights mapped in place become resident as file pages (the page cache) when first read; anonymous
    // pages are what the process copied or allocated itself.
    const ResidentMemory after_run = resident_memory();
    auto gb = [](size_t b) { return static_cast<double>(b) / 1e9; };
    std::fprintf(
        stderr,
        "load: %.2f s for %.2f GB of checkpoint; resident after load %.2f GB (%.2f GB anonymous, %.2f "
        "GB mapped file pages), after the run %.2f GB (%.2f anonymous, %.2f file); %s\n",
        load_seconds, gb(checkpoint.total_bytes()), gb(after_load.total), gb(after_load.anonymous),
        gb(after_load.file), gb(after_run.total), gb(after_run.anonymous), gb(after_run.file),
        bundle.prefault.summary().c_str());
  }
  return 0;
}

}  // namespace xmoe::app
