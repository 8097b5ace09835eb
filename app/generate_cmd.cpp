#include "generate_cmd.hpp"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>

#include "cli_checks.hpp"
#include "kernels/read_bandwidth.hpp"
#include "llm/engine.hpp"
#include "llm/model_bundle.hpp"
#include "process_memory.hpp"
#include "serve/output_parser.hpp"
#include "xmoe/error.hpp"
#include "xmoe/tokenizer.hpp"

namespace xmoe::app {

CLI::App* add_generate_subcommand(CLI::App& app, GenerateOptions& o) {
  CLI::App* cmd = app.add_subcommand("generate", "Generate text with a Hugging Face MoE checkpoint");
  const CLI::Validator positive = positive_integer();
  const CLI::Validator non_negative = non_negative_number();
  cmd->add_option("--model", o.model, "checkpoint directory (config.json, safetensors, tokenizer.json)")
      ->required();
  o.prompt_opt = cmd->add_option("--prompt", o.prompt, "prompt text");
  o.prompt_ids_opt = cmd->add_option("--prompt-ids", o.prompt_ids, "prompt token ids, e.g. 1,2,3");
  o.prompt_opt->excludes(o.prompt_ids_opt);
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
  o.seed_opt = cmd->add_option("--seed", o.seed, "sampling seed (sequence i of --batch uses seed + i)");
  cmd->add_option("--stop", o.stop, "stop string (repeatable); not included in the output");
  cmd->add_option("--stop-id", o.stop_ids, "stop token id (repeatable), in addition to the model's eos");
  cmd->add_flag("--ignore-eos", o.ignore_eos, "do not stop at eos (decode exactly --max-tokens)");
  cmd->add_option("--dtype", o.dtype, "weights and activations: bf16 | f32")
      ->check(CLI::IsMember({"bf16", "f32"}))
      ->capture_default_str();
  cmd->add_option("--isa", o.isa, "kernel level cap: reference | avx2 | avx512 | avx512_bf16 (default: best)")
      ->check(CLI::IsMember({"reference", "avx2", "avx512", "avx512_bf16", "amx"}));
  cmd->add_option("--threads", o.threads, "OpenMP threads (0 = default)")->check(non_negative_integer());
  cmd->add_option("--batch", o.batch, "the same prompt as N concurrent sequences (benchmarks)")
      ->check(positive)
      ->capture_default_str();
  cmd->add_option("--kv-cache-mb", o.kv_cache_mb, "KV cache budget in MiB")
      ->check(positive)
      ->capture_default_str();
  cmd->add_option("--prefill-chunk", o.prefill_chunk, "tokens fed to the model per step (prefill chunk)")
      ->check(positive)
      ->capture_default_str();
  cmd->add_flag("--no-stream", o.no_stream, "print the text once generation ends");
  cmd->add_flag("--print-ids", o.print_ids, "also print the generated token ids to stderr");
  cmd->add_flag("--measure-bandwidth", o.measure_bandwidth,
                "measure the machine's read bandwidth and report decode's share of it");
  return cmd;
}

namespace {

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

}  // namespace

int run_generate(const GenerateOptions& o) {
  XMOE_CHECK(o.prompt_opt->count() + o.prompt_ids_opt->count() == 1,
             "generate: give exactly one of --prompt and --prompt-ids");
  XMOE_CHECK(!o.chat || o.prompt_opt->count() == 1, "generate: --chat needs --prompt (text)");
  XMOE_CHECK(o.chat || (o.system_opt->count() == 0 && !o.no_think && !o.show_reasoning),
             "generate: --system, --no-think and --show-reasoning need --chat");
  if (o.threads > 0) omp_set_num_threads(o.threads);

  const auto load_start = std::chrono::steady_clock::now();
  llm::ModelBundle bundle = llm::ModelBundle::open(o.model);
  const std::optional<Tokenizer>& tokenizer = bundle.tokenizer;
  if (o.prompt_opt->count()) bundle.require_tokenizer("--prompt (give --prompt-ids instead)");
  if (!o.stop.empty()) bundle.require_tokenizer("--stop");
  const llm::ChatSetup& setup = bundle.chat;
  const llm::Checkpoint& checkpoint = bundle.checkpoint;

  std::vector<int32_t> prompt;
  if (o.chat) {
    llm::ChatPromptOptions chat;
    if (o.system_opt->count()) chat.system = o.system;
    chat.user = o.prompt;
    if (o.no_think) chat.enable_thinking = false;
    prompt = tokenizer->encode(llm::render_chat_prompt(setup, chat), /*add_special_tokens=*/false);
  } else if (o.prompt_opt->count()) {
    prompt = tokenizer->encode(o.prompt, /*add_special_tokens=*/true);
  } else {
    prompt = parse_ids(o.prompt_ids);
  }

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

  bundle.load_weights(parse_dtype(o.dtype), o.isa);
  const std::unique_ptr<llm::CausalLM>& model = bundle.model;
  // Opening the checkpoint and building the model (tokenizer and template reading included, both small).
  const double load_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();
  const ResidentMemory after_load = resident_memory();

  llm::EngineOptions engine_options;
  engine_options.kv_cache_bytes = static_cast<size_t>(o.kv_cache_mb) << 20;
  engine_options.max_step_tokens = std::max<int64_t>(o.prefill_chunk, o.batch);
  engine_options.max_running = o.batch;
  engine_options.eos_token_ids = setup.eos_token_ids;
  // A chat's output goes through the template's output parser: the answer on stdout, the reasoning on stderr
  // with --show-reasoning (harmony's channel markup is made of special tokens, which the parser must see).
  const serve::OutputFormat format =
      o.chat ? serve::detect_output_format(setup, checkpoint.config()) : serve::OutputFormat::plain;
  std::unique_ptr<serve::OutputParser> parser;
  if (o.chat) {
    serve::OutputParserOptions parser_options;
    parser_options.parse_tools = false;
    parser = serve::make_output_parser(format, parser_options);
  }
  std::vector<serve::OutputEvent> events;
  const auto print_text = [&](std::string_view text, bool last) {
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
  if (tokenizer)
    engine_options.text_stream =
        llm::tokenizer_text_stream(*tokenizer, !(o.chat && format == serve::OutputFormat::harmony));
  llm::Engine engine(*model, engine_options);

  std::vector<llm::RequestId> ids;
  for (int i = 0; i < o.batch; ++i) {
    llm::GenerationRequest request;
    request.prompt = prompt;
    request.sampling = sampling;
    if (o.seed_opt->count()) request.sampling.seed = o.seed + static_cast<uint64_t>(i);
    request.max_tokens = o.max_tokens;
    request.stop_strings = o.stop;
    request.stop_token_ids = o.stop_ids;
    request.ignore_eos = o.ignore_eos;
    if (i == 0 && !o.no_stream) {
      request.on_delta = [&tokenizer, &print_text](const llm::StreamDelta& d) {
        if (tokenizer) {
          print_text(d.text, d.finish != llm::FinishReason::none);
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
  const double probe_before = o.measure_bandwidth ? kernels::measure_read_bandwidth_gbs() : 0.0;
  const auto start = std::chrono::steady_clock::now();
  engine.run_until_idle();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  std::vector<llm::GenerationResult> results;
  for (llm::RequestId id : ids) results.push_back(engine.take_result(id));
  const llm::GenerationResult& first = results.front();
  if (o.no_stream) {
    if (tokenizer) {
      print_text(first.text, true);
    } else {
      for (int32_t t : first.token_ids) std::printf("%d ", t);
    }
  }
  std::printf("\n");
  std::fflush(stdout);

  const llm::EngineStats& st = engine.stats();
  int64_t generated = 0;
  for (const auto& r : results) generated += static_cast<int64_t>(r.token_ids.size());
  std::fprintf(stderr, "model: %s (%s, %s, %d threads); prompt %zu tokens x %d sequences\n", o.model.c_str(),
               bundle.checkpoint.config().architecture.c_str(), dtype_name(model->dtype()),
               omp_get_max_threads(), prompt.size(), o.batch);
  std::fprintf(stderr, "finish: %s after %zu tokens%s%s; %lld tokens generated in all in %.3f s\n",
               llm::finish_reason_name(first.finish), first.token_ids.size(),
               first.stop_string.empty() ? "" : " at stop string ", first.stop_string.c_str(),
               static_cast<long long>(generated), wall);
  if (o.print_ids) std::fprintf(stderr, "generated ids: %s\n", join_ids(first.token_ids).c_str());
  std::fprintf(stderr, "prefill: %lld tokens in %.3f s = %.2f tokens/s\n",
               static_cast<long long>(st.prefill_tokens), st.prefill_seconds,
               per_second(static_cast<double>(st.prefill_tokens), st.prefill_seconds));
  const double decode_rate = per_second(static_cast<double>(st.decode_tokens), st.decode_seconds);
  if (o.batch > 1) {
    std::fprintf(stderr,
                 "decode: %lld tokens in %lld steps, %.3f s = %.2f tokens/s aggregate (%.2f tokens/s per "
                 "sequence)\n",
                 static_cast<long long>(st.decode_tokens), static_cast<long long>(st.decode_steps),
                 st.decode_seconds, decode_rate, decode_rate / o.batch);
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
  if (o.batch > 1) {
    std::fprintf(
        stderr,
        "weights read per decode step: %.2f MB (%.2f MB at batch 1); decode weight bandwidth: %.2f GB/s",
        step_bytes / 1e6, static_cast<double>(model->weight_bytes_per_token()) / 1e6, gbs);
  } else {
    std::fprintf(stderr, "weights read per decoded token: %.2f MB; decode weight bandwidth: %.2f GB/s",
                 step_bytes / 1e6, gbs);
  }
  if (o.measure_bandwidth) {
    const double probe_after = kernels::measure_read_bandwidth_gbs();
    const double peak = std::max(probe_before, probe_after);
    std::fprintf(stderr,
                 " = %.1f %% of the measured read bandwidth %.2f GB/s (probed %.2f before, %.2f after)",
                 100.0 * gbs / peak, peak, probe_before, probe_after);
  }
  std::fprintf(stderr, "\n");
  if (o.measure_bandwidth) {
    // Weights mapped in place become resident as file pages (the page cache) when first read; anonymous
    // pages are what the process copied or allocated itself.
    const ResidentMemory after_run = resident_memory();
    auto gb = [](size_t b) { return static_cast<double>(b) / 1e9; };
    std::fprintf(
        stderr,
        "load: %.2f s for %.2f GB of checkpoint; resident after load %.2f GB (%.2f GB anonymous, %.2f "
        "GB mapped file pages), after the run %.2f GB (%.2f anonymous, %.2f file)\n",
        load_seconds, gb(checkpoint.total_bytes()), gb(after_load.total), gb(after_load.anonymous),
        gb(after_load.file), gb(after_run.total), gb(after_run.anonymous), gb(after_run.file));
  }
  return 0;
}

}  // namespace xmoe::app
