// Glm4MoeForCausalLM against transformers (tools/make_glm4_moe_fixtures.py): two tiny BF16 models covering
// every branch (QKV biases, q/k norm on and off, partial RoPE 0.25 and the default 0.5, dense then MoE
// layers, 1 and 2 shared experts, sigmoid routing with a correction bias in 1 and 4 groups, norm_topk_prob on
// and off, routed_scaling_factor, an MTP layer in the checkpoint, fused and per-expert experts) and one in
// GLM's FP8 block layout: fp32 logits of every prefill position and of 8 greedy decode steps within 1e-4 of
// transformers, greedy ids identical. Config defaults and errors; init-model (BF16 and FP8 block) and
// quantize through the architecture's tensor plan.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli_runner.hpp"
#include "llm/arch/architecture.hpp"
#include "llm/chat_setup.hpp"
#include "model_oracle.hpp"
#include "xmoe/error.hpp"
#include "xmoe/safetensors.hpp"
#include "xmoe/tokenizer.hpp"

namespace xmoe::llm::test {
namespace {

namespace fs = std::filesystem;

std::string config_error(const nlohmann::json& j) {
  try {
    parse_model_config_text(j.dump(), "config.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

nlohmann::json fixture_config(const std::string& name) {
  return nlohmann::json::parse(std::ifstream(kModels + "/" + name + "/config.json"));
}

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/xmoe_glm4_XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() { fs::remove_all(path); }
};

TEST(Glm4Moe, ConfigDefaultsAreTransformers) {
  // Glm4MoeConfig() with the head_dim GLM-4.5 publishes (its default 4096 / 96 rotates an odd 21 dims).
  const ModelConfig c = parse_model_config_text(
      R"({"architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe", "head_dim": 128})",
      "config.json");
  EXPECT_EQ(c.vocab_size, 151552);
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.intermediate_size, 10944);
  EXPECT_EQ(c.moe_intermediate_size, 1408);
  EXPECT_EQ(c.num_hidden_layers, 46);
  EXPECT_EQ(c.num_attention_heads, 96);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.num_experts, 128);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.rotary_dim, 64);  // partial_rotary_factor 0.5
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.is_sparse_layer(0));  // first_k_dense_replace 1
  EXPECT_TRUE(c.is_sparse_layer(1));
  EXPECT_TRUE(c.is_sparse_layer(45));
  // The plan holds the MTP layer (num_nextn_predict_layers 1) as model.layers.46.*, with no q/k norms
  // (use_qk_norm false) and one shared expert of moe_intermediate_size.
  const auto plan = architecture_of(c).tensors(c, ExpertLayout::per_expert);
  const PlannedTensor* eh = find_planned(plan, "model.layers.46.eh_proj.weight");
  ASSERT_NE(eh, nullptr);
  EXPECT_EQ(eh->shape, (std::vector<int64_t>{4096, 8192}));
  EXPECT_EQ(find_planned(plan, "model.layers.47.input_layernorm.weight"), nullptr);
  EXPECT_EQ(find_planned(plan, "model.layers.1.self_attn.q_norm.weight"), nullptr);
  const PlannedTensor* shared = find_planned(plan, "model.layers.1.mlp.shared_experts.gate_proj.weight");
  ASSERT_NE(shared, nullptr);
  EXPECT_EQ(shared->shape, (std::vector<int64_t>{1408, 4096}));
  EXPECT_EQ(shared->role, TensorRole::quantized_linear);
  EXPECT_EQ(find_planned(plan, "model.layers.1.mlp.gate.weight")->role, TensorRole::kept_linear);
  EXPECT_NE(find_planned(plan, "model.layers.1.mlp.gate.e_score_correction_bias"), nullptr);
  EXPECT_EQ(find_planned(plan, "model.layers.0.mlp.gate.weight"), nullptr);
  EXPECT_NE(find_planned(plan, "model.layers.0.mlp.gate_proj.weight"), nullptr);
}

TEST(Glm4Moe, ConfigErrorsNameTheField) {
  const nlohmann::json j = fixture_config("glm4-moe-a");
  const std::vector<std::pair<std::function<void(nlohmann::json&)>, std::string>> cases = {
      {[](nlohmann::json& b) { b["n_group"] = 3; }, "field 'n_group' = 3 must divide n_routed_experts = 8"},
      {[](nlohmann::json& b) { b["topk_group"] = 5; }, "field 'topk_group' = 5 exceeds n_group = 4"},
      {[](nlohmann::json& b) { b["n_group"] = 8; }, "field 'n_group' = 8 leaves groups of one expert"},
      {[](nlohmann::json& b) { b["num_experts_per_tok"] = 5; }, "field 'num_experts_per_tok' = 5 exceeds"},
      {[](nlohmann::json& b) { b["hidden_act"] = "gelu"; }, "field 'hidden_act' = 'gelu' is not supported"},
      {[](nlohmann::json& b) { b["num_experts"] = 8; }, "field 'num_experts' is not a Glm4MoeConfig field"},
      {[](nlohmann::json& b) { b["mlp_only_layers"] = {0}; },
       "field 'mlp_only_layers' is not a Glm4MoeConfig"},
      {[](nlohmann::json& b) { b["sliding_window"] = 4; }, "field 'sliding_window' is not supported"},
      {[](nlohmann::json& b) { b["routed_scaling_factor"] = -1; },
       "field 'routed_scaling_factor' must be > 0"},
      {[](nlohmann::json& b) { b["n_shared_experts"] = -1; }, "field 'n_shared_experts' must be in [0"},
      {[](nlohmann::json& b) { b["use_qk_norm"] = 1; }, "field 'use_qk_norm' must be true or false"},
      {[](nlohmann::json& b) { b["num_nextn_predict_layers"] = -1; }, "field 'num_nextn_predict_layers'"},
      {[](nlohmann::json& b) { b["first_k_dense_replace"] = "1"; }, "field 'first_k_dense_replace' must be"},
      {[](nlohmann::json& b) { b["partial_rotary_factor"] = 0.1; }, "field 'partial_rotary_factor'"},
  };
  for (const auto& [edit, want] : cases) {
    nlohmann::json bad = j;
    edit(bad);
    const std::string e = config_error(bad);
    EXPECT_NE(e.find(want), std::string::npos) << "want: " << want << "\ngot:  " << e;
  }
}

TEST(Glm4Moe, ConfigAsPublished) {
  const Loaded a = load("glm4-moe-a", DType::f32);
  const ModelConfig& c = a.model->config();
  EXPECT_EQ(c.architecture, "Glm4MoeForCausalLM");
  EXPECT_EQ(c.rotary_dim, 4);  // head_dim 16 · 0.25
  EXPECT_TRUE(c.attention_bias);
  EXPECT_FALSE(c.is_sparse_layer(0));
  EXPECT_TRUE(c.is_sparse_layer(1));
  // The MTP layer is in the checkpoint, not in the model.
  EXPECT_EQ(c.num_hidden_layers, 2);
  EXPECT_TRUE(a.ckpt.contains("model.layers.2.eh_proj.weight"));
  EXPECT_TRUE(a.ckpt.contains("model.layers.2.mlp.experts.gate_up_proj"));
  const ModelConfig b = parse_model_config(kModels + "/glm4-moe-b/config.json");
  EXPECT_EQ(b.rotary_dim, 8);  // the default 0.5
  EXPECT_DOUBLE_EQ(b.rope_theta, 500000.0);
  EXPECT_FALSE(b.norm_topk_prob);
  EXPECT_FALSE(b.is_sparse_layer(1));
  EXPECT_TRUE(b.is_sparse_layer(2));
}

TEST(Glm4Moe, QkNormBiasesGroupsMtpMatchTransformers) {
  expect_matches_oracle("glm4-moe-a", "glm4-moe-a", 1e-4);
}

TEST(Glm4Moe, PerExpertSingleGroupMatchesTransformers) {
  expect_matches_oracle("glm4-moe-b", "glm4-moe-b", 1e-4);
}

TEST(Glm4Moe, Fp8BlockMatchesTransformersOnDequantisedWeights) {
  expect_matches_oracle("glm4-moe-b-fp8", "glm4-moe-b-fp8", 1e-4);
}

// A prompt prefilled in chunks gives the logits of one whole prefill (the KV cache across chunks).
TEST(Glm4Moe, ChunkedPrefillGivesTheSameLogits) {
  Loaded l = load("glm4-moe-a", DType::f32);
  const std::vector<int32_t> prompt = load_expected("glm4-moe-a").back().ids;
  const ModelRun whole = run_alone(*l.model, prompt, 3);
  for (size_t chunk : {1, 5}) {
    const ModelRun r = run_alone(*l.model, prompt, 3, chunk);
    ASSERT_EQ(r.greedy, whole.greedy) << chunk;
    const int64_t V = l.model->config().vocab_size;
    for (size_t row = 0; row < r.prefill.size() / V; ++row)
      EXPECT_LT(row_error(r.prefill.data() + row * V, whole.prefill.data() + row * V, V), 1e-5) << chunk;
  }
}

// xmoe quantize --to fp8-block turns the BF16 model into GLM's FP8 layout: the same tensors with the same
// dtypes and shapes as the fixture written with transformers' Fp8Quantize (router, norms, correction bias,
// embeddings and lm_head kept), its scales and codes equal to Fp8Quantize's bit for bit.
TEST(Glm4Moe, QuantizeWritesGlmsFp8Layout) {
  TempDir tmp;
  const auto r =
      testing_cli::run_cli("quantize --to fp8-block " + kModels + "/glm4-moe-b " + tmp.path + "/q");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto ours = SafetensorsFile::open(tmp.path + "/q/model.safetensors");
  const auto want = SafetensorsFile::open(kModels + "/glm4-moe-b-fp8/model.safetensors");
  EXPECT_EQ(ours.entries().size(), want.entries().size());
  size_t quantized = 0;
  for (const auto& e : want.entries()) {
    ASSERT_TRUE(ours.contains(e.name)) << e.name;
    ASSERT_EQ(ours.entry(e.name).dtype, e.dtype) << e.name;
    ASSERT_EQ(ours.entry(e.name).shape, e.shape) << e.name;
    const auto a = ours.bytes(e.name), b = want.bytes(e.name);
    ASSERT_EQ(a.size(), b.size()) << e.name;
    quantized += e.dtype == "F8_E4M3";
    EXPECT_TRUE(std::equal(a.begin(), a.end(), b.begin())) << e.name << " differs from Fp8Quantize's";
  }
  // q/k/v/o × 3 layers, 2 dense MLPs, 8 experts and the shared expert: 3 projections each.
  EXPECT_EQ(quantized, 12u + 6u + 27u);
  EXPECT_EQ(ours.entry("model.layers.2.mlp.gate.weight").dtype, "BF16");
  Loaded l = load(tmp.path + "/q", DType::f32);
  EXPECT_EQ(l.ckpt.quantization().scheme, QuantScheme::fp8_block);
}

// init-model writes a GLM checkpoint through the architecture's name map, BF16 and FP8 block, with GLM's
// special tokens, the GLM-4.6 chat template and its eos list; xmoe loads and runs both.
TEST(Glm4Moe, InitModelWritesLoadableCheckpoints) {
  TempDir tmp;
  nlohmann::json cfg = fixture_config("glm4-moe-a");
  cfg["vocab_size"] = 600;  // room for the byte-level tokenizer
  cfg.erase("eos_token_id");
  cfg.erase("pad_token_id");
  std::ofstream(tmp.path + "/config.json") << cfg.dump(1);
  for (const char* quant : {"", " --quant fp8-block"}) {
    const std::string out = tmp.path + (*quant ? "/fp8" : "/bf16");
    const auto r =
        testing_cli::run_cli("init-model --config " + tmp.path + "/config.json --out " + out + quant);
    ASSERT_EQ(r.code, 0) << r.output;
    Loaded l = load(out, DType::f32);
    EXPECT_TRUE(l.ckpt.contains("model.layers.2.shared_head.head.weight"));  // the MTP layer, as published
    EXPECT_TRUE(l.ckpt.contains("model.layers.1.mlp.gate.e_score_correction_bias"));
    const ModelRun run = run_alone(*l.model, {5, 6, 7, 8, 9, 10, 11, 12}, 2);
    EXPECT_EQ(run.greedy.size(), 2u);
    if (*quant) {
      EXPECT_EQ(l.ckpt.quantization().scheme, QuantScheme::fp8_block);
      const auto f = SafetensorsFile::open(out + "/model.safetensors");
      EXPECT_EQ(f.entry("model.layers.1.mlp.experts.3.up_proj.weight").dtype, "F8_E4M3");
      EXPECT_EQ(f.entry("model.layers.1.mlp.shared_experts.up_proj.weight").dtype, "F8_E4M3");
      EXPECT_EQ(f.entry("model.layers.0.self_attn.q_proj.weight").dtype, "F8_E4M3");
      EXPECT_EQ(f.entry("model.layers.1.mlp.gate.weight").dtype, "BF16");
      EXPECT_EQ(f.entry("lm_head.weight").dtype, "BF16");
      continue;
    }
    const Tokenizer tok = Tokenizer::from_file(out + "/tokenizer.json");
    for (const char* special :
         {"[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>", "<think>",
          "</think>", "<tool_call>", "</tool_call>", "<arg_key>", "<arg_value>", "<|endoftext|>"}) {
      ASSERT_TRUE(tok.token_to_id(special).has_value()) << special;
      EXPECT_EQ(tok.encode(std::string("a") + special + "b", false).size(), 3u) << special;
    }
    const ChatSetup setup = load_chat_setup(out, l.model->config(), &tok);
    ASSERT_TRUE(setup.chat_template.has_value());
    ChatPromptOptions chat;
    chat.user = "Hi";
    const std::string prompt = render_chat_prompt(setup, chat);
    EXPECT_TRUE(prompt.starts_with("[gMASK]<sop>")) << prompt;
    EXPECT_NE(prompt.find("<|user|>\nHi"), std::string::npos) << prompt;
    EXPECT_TRUE(prompt.ends_with("<|assistant|>")) << prompt;
    // <|endoftext|>, <|user|>, <|observation|> as GLM-4.6's generation_config.
    ASSERT_EQ(setup.eos_token_ids.size(), 3u);
    EXPECT_EQ(setup.eos_token_ids[1], *tok.token_to_id("<|user|>"));
  }
}

// Glm4MoeLiteForCausalLM (GLM-4.7-Flash): MLA attention on GLM's MoE block.
TEST(Glm4MoeLite, ConfigDefaultsAreTransformers) {
  const ModelConfig c = parse_model_config_text(
      R"({"architectures": ["Glm4MoeLiteForCausalLM"], "model_type": "glm4_moe_lite"})", "config.json");
  EXPECT_EQ(c.vocab_size, 154880);
  EXPECT_EQ(c.hidden_size, 2048);
  EXPECT_EQ(c.intermediate_size, 10240);
  EXPECT_EQ(c.moe_intermediate_size, 1536);
  EXPECT_EQ(c.num_hidden_layers, 47);
  EXPECT_EQ(c.num_attention_heads, 20);
  EXPECT_EQ(c.num_experts, 64);
  EXPECT_EQ(c.num_experts_per_tok, 4);
  EXPECT_EQ(c.head_dim, 64);  // qk_rope_head_dim, all of it rotated
  EXPECT_EQ(c.rotary_dim, 64);
  EXPECT_EQ(c.max_position_embeddings, 202752);
  EXPECT_EQ(c.bos_token_id, 0);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int32_t>{1}));
  EXPECT_FALSE(c.is_sparse_layer(0));  // mlp_layer_types: dense, then sparse
  EXPECT_TRUE(c.is_sparse_layer(46));
  const auto plan = architecture_of(c).tensors(c, ExpertLayout::per_expert);
  EXPECT_EQ(find_planned(plan, "model.layers.0.self_attn.q_a_proj.weight")->shape,
            (std::vector<int64_t>{768, 2048}));  // q_lora_rank 768
  EXPECT_EQ(find_planned(plan, "model.layers.0.self_attn.kv_a_proj_with_mqa.weight")->shape,
            (std::vector<int64_t>{512 + 64, 2048}));
  EXPECT_EQ(find_planned(plan, "model.layers.0.self_attn.kv_b_proj.weight")->shape,
            (std::vector<int64_t>{20 * (192 + 256), 512}));
  EXPECT_EQ(find_planned(plan, "model.layers.47.input_layernorm.weight"), nullptr);  // no MTP field: none
}

TEST(Glm4MoeLite, ConfigErrorsNameTheField) {
  const nlohmann::json j = fixture_config("glm4-moe-lite-a");
  const std::vector<std::pair<std::function<void(nlohmann::json&)>, std::string>> cases = {
      {[](nlohmann::json& b) { b["first_k_dense_replace"] = 2; },
       "field 'first_k_dense_replace' = 2 disagrees with mlp_layer_types at layer 1"},
      {[](nlohmann::json& b) {
         b["mlp_layer_types"] = {"dense", "moe"};
       },
       "field 'mlp_layer_types'[1] = \"moe\" must be 'dense' or 'sparse'"},
      {[](nlohmann::json& b) { b["mlp_layer_types"] = {"dense"}; },
       "field 'mlp_layer_types' must be a list of"},
      {[](nlohmann::json& b) { b["attention_bias"] = true; },
       "field 'attention_bias' = true is not supported"},
      {[](nlohmann::json& b) { b["head_dim"] = 8; },
       "field 'head_dim' = 8 differs from qk_rope_head_dim = 4"},
      {[](nlohmann::json& b) { b["qk_rope_head_dim"] = 3; }, "field 'qk_rope_head_dim' = 3 must be even"},
      {[](nlohmann::json& b) { b["n_group"] = 3; }, "field 'n_group' = 3 must divide n_routed_experts = 8"},
      {[](nlohmann::json& b) { b["topk_method"] = "greedy"; },
       "field 'topk_method' = 'greedy' is not supported"},
      {[](nlohmann::json& b) { b["partial_rotary_factor"] = 0.5; }, "field 'partial_rotary_factor' = 0.5"},
  };
  for (const auto& [edit, want] : cases) {
    nlohmann::json bad = j;
    edit(bad);
    const std::string e = config_error(bad);
    EXPECT_NE(e.find(want), std::string::npos) << "want: " << want << "\ngot:  " << e;
  }
}

TEST(Glm4MoeLite, QLoraYarnInterleavedMatchesTransformers) {
  expect_matches_oracle("glm4-moe-lite-a", "glm4-moe-lite-a", 1e-4);
}

TEST(Glm4MoeLite, QProjPlainRopeFusedExpertsMatchesTransformers) {
  expect_matches_oracle("glm4-moe-lite-b", "glm4-moe-lite-b", 1e-4);
}

// init-model (BF16 and FP8 block) writes a checkpoint xmoe loads; its KV cache holds one latent of
// kv_lora_rank + qk_rope_head_dim values per token and layer.
TEST(Glm4MoeLite, InitModelWritesLoadableCheckpoints) {
  TempDir tmp;
  nlohmann::json cfg = fixture_config("glm4-moe-lite-a");
  cfg["vocab_size"] = 600;
  cfg["num_nextn_predict_layers"] = 1;
  cfg.erase("eos_token_id");
  cfg.erase("pad_token_id");
  std::ofstream(tmp.path + "/config.json") << cfg.dump(1);
  for (const char* quant : {"", " --quant fp8-block"}) {
    const std::string out = tmp.path + (*quant ? "/fp8" : "/bf16");
    const auto r =
        testing_cli::run_cli("init-model --config " + tmp.path + "/config.json --out " + out + quant);
    ASSERT_EQ(r.code, 0) << r.output;
    Loaded l = load(out, DType::f32);
    EXPECT_TRUE(l.ckpt.contains("model.layers.2.eh_proj.weight"));  // the MTP layer, planned and skipped
    EXPECT_EQ(run_alone(*l.model, {5, 6, 7, 8, 9, 10, 11, 12}, 2).greedy.size(), 2u);
    const KvCacheShape shape = l.model->kv_cache_shape();
    ASSERT_EQ(shape.layer_latent.size(), 2u);
    EXPECT_EQ(shape.layer_latent[0], 16 + 4);
    if (*quant) {
      const auto f = SafetensorsFile::open(out + "/model.safetensors");
      EXPECT_EQ(f.entry("model.layers.0.self_attn.kv_b_proj.weight").dtype, "F8_E4M3");
      EXPECT_EQ(f.entry("model.layers.1.mlp.shared_experts.up_proj.weight").dtype, "F8_E4M3");
      EXPECT_EQ(f.entry("model.layers.1.mlp.gate.weight").dtype, "BF16");
    }
  }
}

}  // namespace
}  // namespace xmoe::llm::test
