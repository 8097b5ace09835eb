// DeepseekV3ForCausalLM (and Kimi-K2, model_type kimi_k2) against transformers (tests/data/deepseek_v3,
// tools/make_deepseek_v3_fixtures.py): logits of every prompt position and of 8 greedy decode steps, greedy
// ids; q_lora on/off, grouped routing with topk_group < n_group, dense + MoE layers, shared experts, YaRN
// mscale, interleaved and plain RoPE, MTP tensors skipped, FP8 block weights. Plus MLA's absorbed decode
// against its expanded form, the latent KV cache's size, and config errors naming the field.
#include <gtest/gtest.h>
#include <omp.h>
#include <cmath>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "cli_runner.hpp"
#include "llm/checkpoint.hpp"

#include "llm/chat_setup.hpp"
#include "llm/kv_cache.hpp"
#include "llm/model.hpp"
#include "llm/model_bundle.hpp"
#include "llm/model_config.hpp"
#include "llm/model_oracle.hpp"
#include "xmoe/error.hpp"

namespace xmoe::llm {
namespace {

using namespace test;

const std::string kData = std::string(XMOE_TEST_DATA_DIR) + "/deepseek_v3/";

void expect_error_naming(const std::string& json, const std::string& field);

// expect_matches_oracle reads <kModels>/<name>.expected.safetensors.
void expect_oracle(const std::string& name, double tol) {
  expect_matches_oracle(kData + name, "../deepseek_v3/" + name, tol);
}

TEST(DeepseekV3, QLoraGroupedRoutingSharedExpertsYarnMatchesTransformers) {
  expect_oracle("ds-qlora", 1e-4);
}

TEST(DeepseekV3, NoQLoraPlainRopeNoRenormalisationMatchesTransformers) {
  expect_oracle("ds-noqlora", 1e-4);
}

TEST(DeepseekV3, KimiK2ModelTypeMatchesTransformers) {
  expect_oracle("kimi", 1e-4);
}

TEST(DeepseekV3, Fp8BlockWeightsMatchTransformersOnTheDequantisedWeights) {
  expect_oracle("ds-fp8", 1e-4);
}

// DeepSeek-V3.2 at contexts up to index_topk (32 here), where its indexer keeps every position.
TEST(DeepseekV32, MatchesTransformersWithinIndexTopk) {
  expect_oracle("ds-v32", 1e-4);
}

TEST(DeepseekV32, RefusesContextsLongerThanIndexTopkNamingIt) {
  Loaded l = load(kData + "ds-v32", DType::f32);
  KvCache cache(l.model->kv_cache_shape(), DType::f32, kCacheBudget, 4);
  const SequenceId seq = cache.create_sequence();
  ASSERT_TRUE(cache.reserve(seq, 40));
  std::vector<int32_t> tokens(32, 5);
  std::vector<float> logits;
  const SequenceChunk fits{seq, tokens, false};
  l.model->forward(std::span(&fits, 1), cache, logits);  // 32 tokens: exactly index_topk
  const int32_t one = 7;
  const SequenceChunk more{seq, std::span(&one, 1), false};
  try {
    l.model->forward(std::span(&more, 1), cache, logits);
    ADD_FAILURE() << "expected an error naming index_topk";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("index_topk = 32"), std::string::npos) << e.what();
  }
  EXPECT_EQ(cache.length(seq), 32);  // the refused step left the sequence as it was
  std::string json = R"({"architectures": ["DeepseekV32ForCausalLM"], "model_type": "deepseek_v32",
    "q_lora_rank": null})";
  expect_error_naming(json, "q_lora_rank");
}

// A prompt prefilled in one chunk runs the expanded form (k_nope, v from kv_b_proj); one token at a time it
// runs the absorbed form (W_UK folded into the query, W_UV after attention). Same attention, other rounding.
TEST(DeepseekV3, AbsorbedDecodeEqualsExpandedPrefill) {
  for (const char* name : {"ds-qlora", "ds-noqlora"}) {
    Loaded l = load(kData + name, DType::f32);
    const int64_t V = l.model->config().vocab_size;
    const std::vector<int32_t> prompt = load_expected("../deepseek_v3/" + std::string(name)).back().ids;
    const ModelRun expanded = run_alone(*l.model, prompt, 2, 0), absorbed = run_alone(*l.model, prompt, 2, 1);
    ASSERT_EQ(expanded.prefill.size(), absorbed.prefill.size());
    double worst = 0;
    for (size_t t = 0; t < prompt.size(); ++t)
      worst = std::max(worst, row_error(absorbed.prefill.data() + t * V, expanded.prefill.data() + t * V, V));
    EXPECT_LT(worst, 1e-5) << name;
    EXPECT_GT(worst, 0.0) << name << ": the two forms should round differently (is one path not run?)";
    std::printf("%s: absorbed vs expanded, largest max |diff| / max |ref|: %.3g\n", name, worst);
    EXPECT_EQ(expanded.greedy, absorbed.greedy);
  }
}

// One step holding a decode chunk (absorbed form) and a prefill chunk (expanded form) of two sequences gives
// each the bits it gets alone.
TEST(DeepseekV3, MixedBatchOfDecodeAndPrefillEqualsEachAlone) {
  Loaded l = load(kData + "ds-qlora", DType::f32);
  const int64_t V = l.model->config().vocab_size;
  const std::vector<Prompt> prompts = load_expected("../deepseek_v3/ds-qlora");
  const std::vector<int32_t>& a = prompts[0].ids;
  const std::vector<int32_t>& b = prompts[1].ids;
  const ModelRun alone_a = run_alone(*l.model, a, 1), alone_b = run_alone(*l.model, b, 1);
  KvCache cache(l.model->kv_cache_shape(), DType::f32, kCacheBudget, 4);
  const SequenceId sa = cache.create_sequence(), sb = cache.create_sequence();
  ASSERT_TRUE(cache.reserve(sa, static_cast<int64_t>(a.size()) + 1));
  ASSERT_TRUE(cache.reserve(sb, static_cast<int64_t>(b.size())));
  std::vector<float> logits;
  const SequenceChunk prefill_a{sa, a, false};
  l.model->forward(std::span(&prefill_a, 1), cache, logits);
  const int32_t next = alone_a.greedy[0];
  const SequenceChunk both[] = {{sa, std::span(&next, 1), false}, {sb, b, true}};
  l.model->forward(both, cache, logits);
  ASSERT_EQ(logits.size(), static_cast<size_t>(V) * (1 + b.size()));
  EXPECT_TRUE(std::equal(logits.begin(), logits.begin() + V, alone_a.decode.begin()));
  EXPECT_TRUE(std::equal(logits.begin() + V, logits.end(), alone_b.prefill.begin()));
}

TEST(DeepseekV3, ResultsDoNotDependOnTheThreadCount) {
  Loaded l = load(kData + "ds-qlora", DType::bf16);
  const std::vector<int32_t> prompt = load_expected("../deepseek_v3/ds-qlora").back().ids;
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const ModelRun one = run_alone(*l.model, prompt, 3);
  omp_set_num_threads(3);
  const ModelRun three = run_alone(*l.model, prompt, 3);
  omp_set_num_threads(saved);
  EXPECT_EQ(one.prefill, three.prefill);
  EXPECT_EQ(one.decode, three.decode);
}

TEST(DeepseekV3, KvCacheHoldsTheLatentOnly) {
  Loaded l = load(kData + "ds-qlora", DType::f32);
  const KvCacheShape shape = l.model->kv_cache_shape();
  const int layers = l.model->config().num_hidden_layers;
  ASSERT_EQ(shape.layer_latent.size(), static_cast<size_t>(layers));
  // kv_lora_rank 16 + qk_rope_head_dim 8 values per token and layer.
  for (int w : shape.layer_latent) EXPECT_EQ(w, 16 + 8);
  const KvCache f32(shape, DType::f32, 1 << 20, 16), b16(shape, DType::bf16, 1 << 20, 16);
  EXPECT_EQ(f32.bytes_per_token(), static_cast<size_t>((16 + 8) * 4 * layers));
  EXPECT_EQ(b16.bytes_per_token(), static_cast<size_t>((16 + 8) * 2 * layers));
  EXPECT_EQ(f32.bytes_per_block(), f32.bytes_per_token() * 16);
}

TEST(LatentKvCache, LayersOfBothLayoutsShareBlocks) {
  // Layer 0 K/V (2 heads of 4), layer 1 a latent of 6, layer 2 K/V: a block holds all three, back to back.
  const KvCacheShape shape{3, 2, 4, {}, {0, 6, 0}};
  KvCache cache(shape, DType::f32, 100000, 4);
  EXPECT_EQ(cache.bytes_per_token(), static_cast<size_t>((16 + 6 + 16) * 4));
  EXPECT_EQ(cache.bytes_per_block(), cache.bytes_per_token() * 4);
  const auto* base = static_cast<std::byte*>(cache.key_block(0, 1));
  EXPECT_EQ(static_cast<std::byte*>(cache.value_block(0, 1)) - base, 4 * 8 * 4);
  EXPECT_EQ(static_cast<std::byte*>(cache.latent_block(1, 1)) - base, 4 * 16 * 4);
  EXPECT_EQ(static_cast<std::byte*>(cache.key_block(2, 1)) - base, 4 * 22 * 4);
  EXPECT_EQ(cache.latent_width(1), 6);
  EXPECT_EQ(cache.latent_width(0), 0);
  EXPECT_THROW(cache.key_block(1, 0), Error);
  EXPECT_THROW(cache.value_block(1, 0), Error);
  EXPECT_THROW(cache.latent_block(0, 0), Error);
  EXPECT_THROW(KvCache(KvCacheShape{3, 2, 4, {}, {0, 6}}, DType::f32, 100000, 4), Error);
}

std::string config_with(const std::string& extra) {
  return R"({"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "vocab_size": 96,
    "hidden_size": 32, "intermediate_size": 48, "moe_intermediate_size": 8, "num_hidden_layers": 3,
    "num_attention_heads": 4, "num_key_value_heads": 4, "n_routed_experts": 8, "num_experts_per_tok": 3,
    "kv_lora_rank": 16, "q_lora_rank": null, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 12,
    "first_k_dense_replace": 1)" +
         extra + "}";
}

void expect_error_naming(const std::string& json, const std::string& field) {
  try {
    parse_model_config_text(json, "config.json");
    ADD_FAILURE() << "expected an error naming " << field;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'" + field + "'"), std::string::npos) << e.what();
  }
}

TEST(DeepseekV3, ConfigDefaultsAndErrorsNameTheField) {
  const ModelConfig c =
      parse_model_config_text(config_with(R"(, "n_group": 2, "topk_group": 1)"), "config.json");
  EXPECT_EQ(c.head_dim, 8);  // qk_rope_head_dim, as transformers sets it
  EXPECT_EQ(c.num_experts, 8);
  EXPECT_FALSE(c.is_sparse_layer(0));
  EXPECT_TRUE(c.is_sparse_layer(1) && c.is_sparse_layer(2));
  EXPECT_TRUE(c.norm_topk_prob);
  expect_error_naming(config_with(R"(, "n_group": 3, "topk_group": 1)"), "n_group");
  expect_error_naming(config_with(R"(, "n_group": 2, "topk_group": 3)"), "topk_group");
  expect_error_naming(config_with(R"(, "n_group": 4, "topk_group": 1)"), "num_experts_per_tok");
  expect_error_naming(config_with(R"(, "qk_rope_head_dim": 7)"), "qk_rope_head_dim");
  expect_error_naming(config_with(R"(, "kv_lora_rank": 0)"), "kv_lora_rank");
  expect_error_naming(config_with(R"(, "attention_bias": true)"), "attention_bias");
  expect_error_naming(config_with(R"(, "scoring_func": "softmax")"), "scoring_func");
  std::string kimi = config_with(R"(, "n_group": 2, "topk_group": 1)");
  kimi.replace(kimi.find("\"deepseek_v3\""), 13, "\"kimi_k2\"");
  expect_error_naming(kimi, "n_group");
  expect_error_naming(R"({"architectures": ["DeepseekV3ForCausalLM"], "model_type": "qwen3_moe"})",
                      "model_type");
}

TEST(DeepseekV3, KimiK2ModelTypeAloneSelectsTheClass) {
  std::string json = config_with(R"(, "n_group": 1, "topk_group": 1)");
  const std::string arch = R"("architectures": ["DeepseekV3ForCausalLM"], )";
  json.replace(json.find(arch), arch.size(), "");
  json.replace(json.find("\"deepseek_v3\""), 13, "\"kimi_k2\"");
  const ModelConfig c = parse_model_config_text(json, "config.json");
  EXPECT_EQ(c.architecture, "DeepseekV3ForCausalLM");
  EXPECT_EQ(c.model_type, "kimi_k2");
}

// A scratch directory removed afterwards.
struct TempDir {
  std::filesystem::path path = std::filesystem::temp_directory_path() /
                               (std::string("xmoe_deepseek_v3_").append(std::to_string(::getpid())));
  TempDir() {
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

// `xmoe quantize --to fp8-block` quantizes what the architecture's tensor plan marks, as DeepSeek publishes
// it: every attention projection incl. kv_a_proj_with_mqa and kv_b_proj, the MLPs, experts and shared
// experts; not the router, its correction bias, norms, embeddings, lm_head. The FP8 fixture (written by the
// oracle script in that layout) holds the same tensors with the same dtypes and shapes, and the converted
// model matches the oracle's logits (its quantizer computes transformers' Fp8Quantize scales bit for bit).
TEST(DeepseekV3, QuantizeToFp8BlockWritesDeepseeksPublishedLayout) {
  const TempDir dir;
  const auto r = testing_cli::run_cli("quantize --to fp8-block " + kData + "ds-qlora " + dir / "fp8");
  ASSERT_EQ(r.code, 0) << r.output;
  const Checkpoint ours = Checkpoint::open(dir / "fp8"), published = Checkpoint::open(kData + "ds-fp8");
  int quantized = 0;
  for (const std::string& name : published.tensor_names()) {
    const WeightView want = published.weight(name), have = ours.weight(name);
    EXPECT_EQ(have.dtype, want.dtype) << name;
    EXPECT_EQ(have.shape, want.shape) << name;
    quantized += want.dtype == TensorDType::f8_e4m3;
  }
  EXPECT_EQ(ours.tensor_names().size(), published.tensor_names().size());
  EXPECT_GT(quantized, 20);
  expect_matches_oracle(dir / "fp8", "../deepseek_v3/ds-fp8", 1e-4);
}

// init-model writes what the loader reads: BF16 per-expert, BF16 fused experts (the same random streams,
// so the same model bit for bit) and FP8 block; greedy decoding runs through the latent cache.
TEST(DeepseekV3, InitModelCheckpointsLoadAndRun) {
  const TempDir dir;
  std::vector<ModelRun> runs;
  for (const char* flags : {"", " --expert-layout fused", " --quant fp8-block"}) {
    const std::string out = dir / ("m" + std::to_string(runs.size()));
    const auto r = testing_cli::run_cli("init-model --config " + kData + "ds-qlora/config.json --out " + out +
                                        " --seed 3" + flags);
    ASSERT_EQ(r.code, 0) << r.output;
    Loaded l = load(out, DType::f32);
    runs.push_back(run_alone(*l.model, {3, 4, 5, 6, 7}, 4));
    EXPECT_EQ(runs.back().greedy.size(), 4u);
    for (float v : runs.back().decode) ASSERT_TRUE(std::isfinite(v));
  }
  EXPECT_EQ(runs[0].prefill, runs[1].prefill);
  EXPECT_EQ(runs[0].decode, runs[1].decode);
}

// init-model for model_type kimi_k2 writes Kimi-K2's tokenizer form: tiktoken.model + tokenizer_config.json
// (no tokenizer.json) with Kimi's specials and chat template; the bundle reads it back, the template renders
// Kimi's turn markers and each marker encodes as its one special id; eos is <|im_end|>.
TEST(DeepseekV3, KimiK2InitModelWritesATiktokenVocabularyAndKimisTemplate) {
  const TempDir dir;
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(kData + "kimi/config.json"));
  cfg["vocab_size"] = 1024;
  const std::string config = dir / "config.json", out = dir / "m";
  std::ofstream(config) << cfg.dump();
  const auto r = testing_cli::run_cli("init-model --config " + config + " --out " + out);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(std::filesystem::exists(out + "/tiktoken.model"));
  EXPECT_FALSE(std::filesystem::exists(out + "/tokenizer.json"));
  const ModelBundle b = ModelBundle::open(out);
  ASSERT_TRUE(b.tokenizer.has_value());
  ChatPromptOptions o;
  o.user = "Hello 世界";
  const std::string prompt = render_chat_prompt(b.chat, o);
  EXPECT_NE(prompt.find("<|im_user|>user<|im_middle|>Hello 世界<|im_end|>"), std::string::npos) << prompt;
  EXPECT_TRUE(prompt.ends_with("<|im_assistant|>assistant<|im_middle|>")) << prompt;
  const std::optional<int32_t> im_end = b.tokenizer->token_to_id("<|im_end|>");
  ASSERT_TRUE(im_end.has_value());
  EXPECT_EQ(b.tokenizer->encode("<|im_end|>"), std::vector<int32_t>{*im_end});
  EXPECT_NE(std::find(b.chat.eos_token_ids.begin(), b.chat.eos_token_ids.end(), *im_end),
            b.chat.eos_token_ids.end());
}

}  // namespace
}  // namespace xmoe::llm
