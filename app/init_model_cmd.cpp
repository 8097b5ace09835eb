#include "init_model_cmd.hpp"

#include <omp.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <vector>

#include "byte_level_tokenizer_writer.hpp"
#include "cli_checks.hpp"
#include "kernels/quant/quantize.hpp"
#include "llm/arch/architecture.hpp"
#include "llm/model_config.hpp"
#include "llm/progress_bar.hpp"
#include "quant_checkpoint.hpp"
#include "safetensors_stream_writer.hpp"
#include "tiktoken_tokenizer_writer.hpp"
#include "util/random.hpp"
#include "util/text_file.hpp"
#include "xmoe/dtype.hpp"
#include "xmoe/error.hpp"

namespace xmoe::app {

namespace {

namespace fs = std::filesystem;

using llm::ExpertLayout;
using llm::PlannedTensor;
using llm::TensorInit;
using llm::TensorRole;
constexpr int64_t kChunkElements = int64_t{1} << 22;

enum class OutDType { bf16, f32 };

size_t element_size(OutDType t) {
  return t == OutDType::bf16 ? 2 : 4;
}

const char* torch_dtype_name(OutDType t) {
  return t == OutDType::bf16 ? "bfloat16" : "float32";
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : s) h = (h ^ ch) * 0x100000001b3ull;
  return h;
}

void store(OutDType dt, std::byte* out, int64_t i, float v) {
  if (dt == OutDType::bf16) {
    const uint16_t b = bf16::from_float(v);
    std::memcpy(out + 2 * i, &b, 2);
  } else {
    std::memcpy(out + 4 * i, &v, 4);
  }
}

// Elements [first, first + n) of `source`'s random stream: elements 2p and 2p + 1 are the two Box-Muller
// outputs of pair p, a pure function of (seed, source, p), so the values are the same for any thread count
// and any chunking. One 64-bit hash gives both 23-bit uniforms of a pair and the math is in float: the
// benchmark checkpoint is 5.6e9 values, and this keeps writing it at disk speed on two cores.
void fill_normal(uint64_t seed, double std_dev, const std::string& source, int64_t first, int64_t n,
                 OutDType dt, std::byte* out) {
  const uint64_t key = splitmix64(seed ^ splitmix64(fnv1a(source)));
  const int64_t pair_begin = first / 2, pair_end = (first + n + 1) / 2;
  constexpr float kTwoPi = 6.2831853f, kInv23 = 1.0f / 8388608.0f;
  const float scale = static_cast<float>(std_dev);
  // Small runs (a fused tensor is one run per expert) are not worth waking the thread team for.
#pragma omp parallel for schedule(static) if (pair_end - pair_begin > 32768)
  for (int64_t p = pair_begin; p < pair_end; ++p) {
    const uint64_t h = splitmix64(key + static_cast<uint64_t>(p));
    // In (0, 1): never 0, so the log is finite.
    const float u1 = (static_cast<float>(h >> 41) + 0.5f) * kInv23;
    const float u2 = (static_cast<float>((h >> 9) & 0x7fffffu) + 0.5f) * kInv23;
    const float r = scale * std::sqrt(-2.0f * std::log(u1));
    const float angle = kTwoPi * u2;
    const int64_t e0 = 2 * p - first, e1 = e0 + 1;
    if (e0 >= 0 && e0 < n) store(dt, out, e0, r * std::cos(angle));
    if (e1 >= 0 && e1 < n) store(dt, out, e1, r * std::sin(angle));
  }
}

// Elements [first, first + n) of the planned tensor.
void fill_tensor(uint64_t seed, double std_dev, const PlannedTensor& t, int64_t first, int64_t n, OutDType dt,
                 std::byte* out) {
  if (t.init != TensorInit::normal) {
    const float v = t.init == TensorInit::ones ? 1.0f : 0.0f;
    for (int64_t i = 0; i < n; ++i) store(dt, out, i, v);
    return;
  }
  int64_t seg_start = 0;
  for (const auto& seg : t.segments) {
    const int64_t lo = std::max(first, seg_start), hi = std::min(first + n, seg_start + seg.count);
    if (lo < hi)
      fill_normal(seed, std_dev, seg.source, lo - seg_start, hi - lo, dt,
                  out + (lo - first) * element_size(dt));
    seg_start += seg.count;
  }
}

struct Shard {
  std::string file;
  std::vector<size_t> tensors;  // indices into the plan
  size_t bytes = 0;
};

// What one planned tensor becomes on disk: itself in the output dtype, or a quantized linear's tensors.
std::vector<StreamedTensor> output_specs(const PlannedTensor& t, OutDType dt,
                                         const std::optional<QuantTarget>& quant) {
  if (quant && t.role == TensorRole::quantized_linear)
    return quantized_tensor_specs(*quant, t.name, t.shape[0], t.shape[1]);
  if (quant && t.role == TensorRole::mxfp4_experts)
    return mxfp4_fused_expert_specs(*quant, t.name, t.shape[0], t.shape[1], t.shape[2]);
  return {{t.name, dt == OutDType::bf16 ? "BF16" : "F32", t.shape,
           static_cast<size_t>(t.numel()) * element_size(dt)}};
}

// Greedy, in plan order (a layer's tensors stay together); a tensor larger than the limit gets a shard alone.
std::vector<Shard> assign_shards(const std::vector<PlannedTensor>& plan, OutDType dt,
                                 const std::optional<QuantTarget>& quant, size_t limit) {
  std::vector<Shard> shards;
  for (size_t i = 0; i < plan.size(); ++i) {
    size_t bytes = 0;
    for (const auto& spec : output_specs(plan[i], dt, quant)) bytes += spec.nbytes;
    if (shards.empty() || (!shards.back().tensors.empty() && shards.back().bytes + bytes > limit))
      shards.emplace_back();
    shards.back().tensors.push_back(i);
    shards.back().bytes += bytes;
  }
  char name[64];
  for (size_t s = 0; s < shards.size(); ++s) {
    std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
    shards[s].file = shards.size() == 1 ? "model.safetensors" : name;
  }
  return shards;
}

void prepare_out_dir(const std::string& dir) {
  std::error_code ec;
  if (fs::exists(dir, ec)) {
    XMOE_CHECK(fs::is_directory(dir, ec), "init-model: --out ", dir, " exists and is not a directory");
    XMOE_CHECK(fs::is_empty(dir, ec), "init-model: --out ", dir,
               " is not empty (choose a new or empty directory; existing checkpoints are not overwritten)");
    return;
  }
  fs::create_directories(dir, ec);
  XMOE_CHECK(!ec, "init-model: cannot create --out ", dir, ": ", ec.message());
}

// config.json (the input's own text and key order, with the dtype and the tokenizer's ids filled in) and
// generation_config.json.
void write_config_files(const InitModelOptions& o, const llm::ModelConfig& config, OutDType dt,
                        const std::optional<QuantTarget>& quant, const std::vector<PlannedTensor>& plan,
                        const llm::InitModelSpec& spec, const std::map<std::string, int32_t>& ids) {
  nlohmann::ordered_json cfg = nlohmann::ordered_json::parse(read_text_file(o.config));
  if (!cfg.contains("architectures")) cfg["architectures"] = {config.architecture};
  const char* torch_dtype = torch_dtype_name(dt);
  cfg["torch_dtype"] = torch_dtype;
  if (cfg.contains("dtype")) cfg["dtype"] = torch_dtype;  // transformers v5's name for it
  if (!ids.empty()) {
    // An architecture without a BOS token (GLM) writes null, as its published config.json does.
    cfg["bos_token_id"] =
        spec.config_bos.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(ids.at(spec.config_bos));
    cfg["eos_token_id"] = ids.at(spec.config_eos);
  }
  const bool gpt_oss_mxfp4 = std::any_of(
      plan.begin(), plan.end(), [](const PlannedTensor& t) { return t.role == TensorRole::mxfp4_experts; });
  if (quant && gpt_oss_mxfp4) {
    write_mxfp4_experts_config(cfg, llm::kept_linear_modules(plan));
  } else if (quant) {
    write_quantization_config(*quant, cfg, llm::kept_linear_modules(plan), o.out);
  }
  write_text_file(o.out + "/config.json", cfg.dump(2) + "\n");

  nlohmann::ordered_json gen;
  if (!ids.empty()) {
    if (!spec.config_bos.empty()) gen["bos_token_id"] = ids.at(spec.config_bos);
    nlohmann::ordered_json eos = nlohmann::ordered_json::array();
    for (const std::string& e : spec.generation_eos) eos.push_back(ids.at(e));
    gen["eos_token_id"] = eos;
    gen["pad_token_id"] = ids.at(spec.generation_pad);
  }
  for (const auto& [key, value] : spec.sampling.items()) gen[key] = value;
  write_text_file(o.out + "/generation_config.json", gen.dump(2) + "\n");
}

// A quantized linear: its f32 values generated whole (the largest is an attention projection, tens of MB),
// quantized, and their bytes returned in output_specs' order. NVFP4's gate and up share the global scale of
// the pair, so the partner's values are generated too to find it.
std::vector<std::vector<uint8_t>> quantized_linear(uint64_t seed, double std_dev,
                                                   const std::vector<PlannedTensor>& plan,
                                                   const PlannedTensor& t, QuantTarget quant) {
  const auto values = [&](const PlannedTensor& p) {
    std::vector<float> v(static_cast<size_t>(p.numel()));
    fill_tensor(seed, std_dev, p, 0, p.numel(), OutDType::f32, reinterpret_cast<std::byte*>(v.data()));
    return v;
  };
  const std::vector<float> w = values(t);
  float scale_2 = 0.0f;
  if (is_nvfp4(quant)) {
    scale_2 = kernels::quant::nvfp4_weight_scale_2(w.data(), t.numel());
    for (const auto& p : plan)
      if (!t.scale_partner.empty() && p.name == t.scale_partner) {
        const std::vector<float> pv = values(p);
        scale_2 = std::max(scale_2, kernels::quant::nvfp4_weight_scale_2(pv.data(), p.numel()));
      }
  }
  return quantized_tensor_bytes(quant, w.data(), t.shape[0], t.shape[1], scale_2);
}

// gpt-oss's fused experts [E, in, out] (x @ W) as published in MXFP4: each expert transposed to its
// [out, in] linear and quantized; the bytes of <name>_blocks, then of <name>_scales.
std::vector<std::vector<uint8_t>> mxfp4_experts(uint64_t seed, double std_dev, const PlannedTensor& t) {
  const int64_t E = t.shape[0], in = t.shape[1], out = t.shape[2];
  std::vector<std::vector<uint8_t>> bytes(2);
  std::vector<float> w(static_cast<size_t>(in * out));
  for (int64_t e = 0; e < E; ++e) {
    fill_tensor(seed, std_dev, t, e * in * out, in * out, OutDType::f32,
                reinterpret_cast<std::byte*>(w.data()));
    append_mxfp4_fused_expert(w.data(), in, out, bytes);
  }
  return bytes;
}

// Streams every planned tensor into its shard (and writes the index when there are several); returns the
// bytes of weights written.
size_t write_weights(const InitModelOptions& o, double std_dev, const std::vector<PlannedTensor>& plan,
                     const std::vector<Shard>& shards, OutDType dt, const std::optional<QuantTarget>& quant) {
  size_t total = 0;
  for (const auto& s : shards) total += s.bytes;
  llm::ProgressBar progress("init-model " + o.out);
  size_t done = 0;
  // Two buffers: one is filled (all threads) while the other is written by a helper thread.
  std::vector<std::byte> buffers[2];
  for (auto& b : buffers) b.resize(static_cast<size_t>(kChunkElements) * element_size(dt));
  nlohmann::json weight_map = nlohmann::json::object();
  for (const Shard& shard : shards) {
    std::vector<StreamedTensor> specs;
    for (size_t i : shard.tensors)
      for (auto& spec : output_specs(plan[i], dt, quant)) {
        weight_map[spec.name] = shard.file;
        specs.push_back(std::move(spec));
      }
    SafetensorsStreamWriter writer(o.out + "/" + shard.file, specs, {{"format", "pt"}});
    std::future<void> pending;
    int which = 0;
    for (size_t i : shard.tensors) {
      const PlannedTensor& t = plan[i];
      if (quant && (t.role == TensorRole::quantized_linear || t.role == TensorRole::mxfp4_experts)) {
        if (pending.valid()) pending.get();
        for (const auto& bytes : t.role == TensorRole::mxfp4_experts
                                     ? mxfp4_experts(o.seed, std_dev, t)
                                     : quantized_linear(o.seed, std_dev, plan, t, *quant)) {
          writer.write({reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()});
          done += bytes.size();
        }
        progress.update(done, total);
        continue;
      }
      for (int64_t first = 0; first < t.numel(); first += kChunkElements) {
        const int64_t n = std::min(kChunkElements, t.numel() - first);
        std::vector<std::byte>& buffer = buffers[which];
        fill_tensor(o.seed, std_dev, t, first, n, dt, buffer.data());
        if (pending.valid()) pending.get();  // the other buffer is free again; rethrows a write error
        const size_t nbytes = static_cast<size_t>(n) * element_size(dt);
        pending = std::async(std::launch::async, [&writer, &buffer, nbytes] {
          writer.write({buffer.data(), nbytes});
        });
        which ^= 1;
        done += nbytes;
        progress.update(done, total);
      }
    }
    if (pending.valid()) pending.get();
    writer.finish();
  }
  progress.finish();
  if (shards.size() > 1) {
    nlohmann::json index;
    index["metadata"] = {{"total_size", total}};
    index["weight_map"] = weight_map;
    write_text_file(o.out + "/model.safetensors.index.json", index.dump(2) + "\n");
  }
  return total;
}

}  // namespace

CLI::App* add_init_model_subcommand(CLI::App& app, InitModelOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "init-model",
      "Write a random-weight Hugging Face checkpoint (weights, config, tokenizer) for a config.json");
  cmd->add_option("--config", o.config,
                  "config.json of a supported architecture (" + llm::supported_architecture_names() + ")")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--out", o.out, "output directory (created; must be empty if it exists)")->required();
  cmd->add_option("--dtype", o.dtype, "weight dtype: bf16 | f32")
      ->check(CLI::IsMember({"bf16", "f32"}))
      ->capture_default_str();
  cmd->add_option("--seed", o.seed, "random seed (same seed, same weights)")
      ->check(non_negative_integer())
      ->capture_default_str();
  cmd->add_option(
         "--expert-layout", o.expert_layout,
         "per-expert (one tensor per expert and projection) | fused (a layer's experts in 3-D tensors)")
      ->check(CLI::IsMember({"per-expert", "fused"}))
      ->capture_default_str();
  cmd->add_option("--shard-size-mb", o.shard_size_mb, "largest safetensors shard in MiB")
      ->check(positive_integer())
      ->capture_default_str();
  cmd->add_option(
         "--quant", o.quant,
         "quantize the attention and MLP/expert linears as published: fp8-block (DeepSeek/Qwen3-FP8) | "
         "mxfp4 (compressed-tensors) | nvfp4 (ModelOpt, or see --quant-layout); embeddings, norms, router "
         "and lm_head stay in "
         "--dtype")
      ->check(CLI::IsMember(kQuantTargetFlags));
  cmd->add_option("--quant-layout", o.quant_layout, kQuantLayoutHelp)
      ->check(CLI::IsMember(kQuantLayoutFlags));
  cmd->add_option("--vocab-format", o.vocab_format,
                  "tokenizer files: tokenizer.json | tiktoken (tiktoken.model + tokenizer_config.json, as "
                  "Kimi-K2); default: the architecture's")
      ->check(CLI::IsMember({"tokenizer.json", "tiktoken"}));
  return cmd;
}

int run_init_model(const InitModelOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  const llm::ModelConfig config = llm::parse_model_config(o.config);
  const OutDType dt = o.dtype == "f32" ? OutDType::f32 : OutDType::bf16;
  const ExpertLayout layout = o.expert_layout == "fused" ? ExpertLayout::fused : ExpertLayout::per_expert;
  std::optional<QuantTarget> quant;
  XMOE_CHECK(o.quant_layout.empty() || !o.quant.empty(), "init-model: --quant-layout needs --quant");
  if (!o.quant.empty()) {
    quant = parse_quant_target(o.quant, o.quant_layout);
    XMOE_CHECK(
        layout == ExpertLayout::per_expert, "init-model: --quant ", o.quant,
        " needs --expert-layout per-expert (the published quantized checkpoints hold per-expert linears)");
  }
  const llm::Architecture& arch = llm::architecture_of(config);
  const llm::InitModelSpec spec = arch.init_model_spec(config);
  const std::vector<PlannedTensor> plan = arch.tensors(config, layout);
  // The config's sizes are each in range, but their products can still be absurd: check before writing.
  constexpr uint64_t kMaxTotalBytes = uint64_t{1} << 50;
  uint64_t total_bytes = 0;
  for (const auto& t : plan) {
    uint64_t n = element_size(dt);
    for (int64_t d : t.shape)
      XMOE_CHECK(!__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n) && n <= kMaxTotalBytes,
                 "init-model: ", o.config, ": tensor '", t.name, "' would be too large");
    total_bytes += n;
    XMOE_CHECK(total_bytes <= kMaxTotalBytes, "init-model: ", o.config, ": the model would be too large");
  }
  XMOE_CHECK(o.shard_size_mb <= (int64_t{1} << 30), "init-model: --shard-size-mb ", o.shard_size_mb,
             " is too large");
  const std::vector<Shard> shards =
      assign_shards(plan, dt, quant, static_cast<size_t>(o.shard_size_mb) * (size_t{1} << 20));
  prepare_out_dir(o.out);
  std::error_code ec;
  const fs::space_info space = fs::space(o.out, ec);
  XMOE_CHECK(ec || space.available >= total_bytes, "init-model: the checkpoint needs ",
             static_cast<double>(total_bytes) / 1e9, " GB but ", o.out, " has only ",
             static_cast<double>(space.available) / 1e9, " GB free");

  // Tokenizer first: config.json and generation_config.json name its special-token ids.
  std::map<std::string, int32_t> ids;
  const bool tiktoken = o.vocab_format.empty() ? spec.tiktoken_vocabulary : o.vocab_format == "tiktoken";
  const int64_t min_vocab = tiktoken ? kMinTiktokenVocab : min_byte_level_vocab(spec);
  if (config.vocab_size >= min_vocab)
    ids = tiktoken ? write_tiktoken_tokenizer(o.out, config.vocab_size, spec)
                   : write_byte_level_tokenizer(o.out, config.vocab_size, spec);
  else
    std::fprintf(stderr, "init-model: vocab_size %lld < %lld: no tokenizer written (use --prompt-ids)\n",
                 static_cast<long long>(config.vocab_size), static_cast<long long>(min_vocab));

  write_config_files(o, config, dt, quant, plan, spec, ids);
  const size_t total = write_weights(o, spec.initializer_range, plan, shards, dt, quant);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf(
      "wrote %s: %s, %zu tensors (%s experts), %.3f GB of %s%s%s in %zu file(s)%s, %.1f s (%d threads)\n",
      o.out.c_str(), config.architecture.c_str(), plan.size(), o.expert_layout.c_str(),
      static_cast<double>(total) / 1e9, torch_dtype_name(dt), quant ? " + " : "",
      quant ? quant_target_flag(*quant) : "", shards.size(), !ids.empty() ? " + tokenizer" : "", secs,
      omp_get_max_threads());
  return 0;
}

}  // namespace xmoe::app
