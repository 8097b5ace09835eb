// parse_model_config against transformers: config.json as transformers v5 writes it, transformers'
// Qwen3MoeConfig defaults (tools/make_checkpoint_fixtures.py), and bad input that must name the field.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "llm/model_config.hpp"
#include "xmoe/error.hpp"

namespace {

using xmoe::llm::ModelConfig;
using xmoe::llm::parse_model_config;
using xmoe::llm::parse_model_config_text;

const std::string kData = std::string(XMOE_TEST_DATA_DIR) + "/checkpoints/";

nlohmann::json load_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

// A complete config in the transformers v4 form of Qwen/Qwen3-30B-A3B (rope_theta at the top level).
nlohmann::json qwen3_30b_a3b_v4() {
  return nlohmann::json::parse(R"({
    "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144,
    "max_position_embeddings": 40960, "max_window_layers": 48, "mlp_only_layers": [], "model_type": "qwen3_moe",
    "moe_intermediate_size": 768, "norm_topk_prob": true, "num_attention_heads": 32, "num_experts": 128,
    "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4, "output_router_logits": false,
    "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001,
    "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0", "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})");
}

// The error message of parsing `j`, or "" when it parses.
std::string error_of(const nlohmann::json& j) {
  try {
    parse_model_config_text(j.dump(), "cfg/config.json");
  } catch (const xmoe::Error& e) {
    return e.what();
  }
  return "";
}

std::string error_of_text(const std::string& text) {
  try {
    parse_model_config_text(text, "cfg/config.json");
  } catch (const xmoe::Error& e) {
    return e.what();
  }
  return "";
}

TEST(ModelConfig, ParsesQwen3MoeV4Config) {
  const ModelConfig c = parse_model_config_text(qwen3_30b_a3b_v4().dump(), "config.json");
  EXPECT_EQ(c.architecture, "Qwen3MoeForCausalLM");
  EXPECT_EQ(c.model_type, "qwen3_moe");
  EXPECT_EQ(c.vocab_size, 151936);
  EXPECT_EQ(c.hidden_size, 2048);
  EXPECT_EQ(c.intermediate_size, 6144);
  EXPECT_EQ(c.moe_intermediate_size, 768);
  EXPECT_EQ(c.num_hidden_layers, 48);
  EXPECT_EQ(c.num_attention_heads, 32);
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_EQ(c.head_dim, 128);  // explicit, not hidden / heads = 64
  EXPECT_EQ(c.num_experts, 128);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  EXPECT_FALSE(c.rope_scaling.has_value());
  EXPECT_EQ(c.max_position_embeddings, 40960);
  ASSERT_TRUE(c.bos_token_id.has_value());
  EXPECT_EQ(*c.bos_token_id, 151643);
  EXPECT_EQ(c.eos_token_ids, std::vector<int32_t>{151645});
  EXPECT_EQ(c.torch_dtype, "bfloat16");
  for (int i = 0; i < 48; ++i) EXPECT_TRUE(c.is_sparse_layer(i)) << i;
}

TEST(ModelConfig, ParsesConfigSavedByTransformersV5) {
  // v5 writes num_local_experts, dtype and rope_parameters (holding rope_theta).
  const nlohmann::json j = load_json(kData + "v5_saved_config.json");
  ASSERT_TRUE(j.contains("num_local_experts"));
  ASSERT_TRUE(j.contains("rope_parameters"));
  const ModelConfig c = parse_model_config(kData + "v5_saved_config.json");
  EXPECT_EQ(c.num_experts, j["num_local_experts"].get<int>());
  EXPECT_EQ(c.num_experts_per_tok, j["num_experts_per_tok"].get<int>());
  EXPECT_EQ(c.head_dim, j["head_dim"].get<int>());
  EXPECT_DOUBLE_EQ(c.rope_theta, j["rope_parameters"]["rope_theta"].get<double>());
  EXPECT_FALSE(c.rope_scaling.has_value());  // rope_type "default"
  EXPECT_EQ(c.torch_dtype, j["dtype"].get<std::string>());
  EXPECT_TRUE(c.attention_bias);
  EXPECT_EQ(c.mlp_only_layers, j["mlp_only_layers"].get<std::vector<int>>());
  // Layer 1 is in mlp_only_layers: dense, as transformers builds it.
  EXPECT_TRUE(c.is_sparse_layer(0));
  EXPECT_FALSE(c.is_sparse_layer(1));
  EXPECT_TRUE(c.is_sparse_layer(2));
}

TEST(ModelConfig, ParsesYarnFromV5RopeParameters) {
  const nlohmann::json j = load_json(kData + "v5_saved_yarn_config.json");
  const ModelConfig c = parse_model_config(kData + "v5_saved_yarn_config.json");
  ASSERT_TRUE(c.rope_scaling.has_value());
  EXPECT_EQ(c.rope_scaling->type, "yarn");
  EXPECT_DOUBLE_EQ(c.rope_scaling->factor, j["rope_parameters"]["factor"].get<double>());
  EXPECT_EQ(c.rope_scaling->original_max_position_embeddings,
            j["rope_parameters"]["original_max_position_embeddings"].get<int64_t>());
  EXPECT_DOUBLE_EQ(c.rope_theta, j["rope_parameters"]["rope_theta"].get<double>());
  EXPECT_DOUBLE_EQ(c.rope_scaling->beta_fast, 32.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling->beta_slow, 1.0);
  EXPECT_FALSE(c.rope_scaling->attention_factor.has_value());
}

TEST(ModelConfig, DefaultsAreTransformers) {
  const nlohmann::json d = load_json(kData + "qwen3_moe_defaults.json");
  const ModelConfig c = parse_model_config_text(R"({"model_type": "qwen3_moe"})", "config.json");
  EXPECT_EQ(c.architecture, "Qwen3MoeForCausalLM");
  EXPECT_EQ(c.vocab_size, d["vocab_size"].get<int64_t>());
  EXPECT_EQ(c.hidden_size, d["hidden_size"].get<int64_t>());
  EXPECT_EQ(c.intermediate_size, d["intermediate_size"].get<int64_t>());
  EXPECT_EQ(c.moe_intermediate_size, d["moe_intermediate_size"].get<int64_t>());
  EXPECT_EQ(c.num_hidden_layers, d["num_hidden_layers"].get<int>());
  EXPECT_EQ(c.num_attention_heads, d["num_attention_heads"].get<int>());
  EXPECT_EQ(c.num_key_value_heads, d["num_key_value_heads"].get<int>());
  EXPECT_EQ(c.head_dim, d["head_dim"].get<int>());
  EXPECT_EQ(c.num_experts, d["num_experts"].get<int>());
  EXPECT_EQ(c.num_experts_per_tok, d["num_experts_per_tok"].get<int>());
  EXPECT_EQ(c.norm_topk_prob, d["norm_topk_prob"].get<bool>());
  EXPECT_EQ(c.decoder_sparse_step, d["decoder_sparse_step"].get<int>());
  EXPECT_EQ(c.mlp_only_layers, d["mlp_only_layers"].get<std::vector<int>>());
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, d["rms_norm_eps"].get<double>());
  EXPECT_DOUBLE_EQ(c.rope_theta, d["rope_theta"].get<double>());
  EXPECT_EQ(c.max_position_embeddings, d["max_position_embeddings"].get<int64_t>());
  EXPECT_EQ(c.tie_word_embeddings, d["tie_word_embeddings"].get<bool>());
  EXPECT_EQ(c.attention_bias, d["attention_bias"].get<bool>());
  EXPECT_FALSE(c.bos_token_id.has_value());
  EXPECT_TRUE(c.eos_token_ids.empty());
}

TEST(ModelConfig, EosListAndSparseStep) {
  nlohmann::json j = qwen3_30b_a3b_v4();
  j["eos_token_id"] = {151645, 151643};
  j["decoder_sparse_step"] = 2;
  j["mlp_only_layers"] = {3};
  j["num_hidden_layers"] = 6;
  const ModelConfig c = parse_model_config_text(j.dump(), "config.json");
  EXPECT_EQ(c.eos_token_ids, (std::vector<int32_t>{151645, 151643}));
  // (i + 1) % 2 == 0 and not in mlp_only_layers: layers 1 and 5 (3 is forced dense).
  const bool expected[] = {false, true, false, false, false, true};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(c.is_sparse_layer(i), expected[i]) << i;
  j["num_experts"] = 0;  // no experts: every layer dense
  const ModelConfig dense = parse_model_config_text(j.dump(), "config.json");
  for (int i = 0; i < 6; ++i) EXPECT_FALSE(dense.is_sparse_layer(i)) << i;
}

TEST(ModelConfig, RopeScalingForms) {
  nlohmann::json j = qwen3_30b_a3b_v4();
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  ModelConfig c = parse_model_config_text(j.dump(), "config.json");
  ASSERT_TRUE(c.rope_scaling.has_value());
  EXPECT_EQ(c.rope_scaling->type, "linear");
  EXPECT_DOUBLE_EQ(c.rope_scaling->factor, 2.0);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);  // top level, the dict has none

  // rope_type wins over type; a non-null rope_scaling wins over rope_parameters (as in transformers).
  j["rope_scaling"] = {{"type", "linear"}, {"rope_type", "dynamic"}, {"factor", 3}};
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 5000.0}};
  c = parse_model_config_text(j.dump(), "config.json");
  EXPECT_EQ(c.rope_scaling->type, "dynamic");
  EXPECT_DOUBLE_EQ(c.rope_scaling->factor, 3.0);

  // rope_parameters alone: its rope_theta overrides the top-level one.
  j.erase("rope_scaling");
  c = parse_model_config_text(j.dump(), "config.json");
  EXPECT_FALSE(c.rope_scaling.has_value());
  EXPECT_DOUBLE_EQ(c.rope_theta, 5000.0);

  j["rope_parameters"] = {{"rope_type", "llama3"},  {"factor", 8.0},
                          {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                          {"rope_theta", 500000.0}, {"original_max_position_embeddings", 8192}};
  c = parse_model_config_text(j.dump(), "config.json");
  EXPECT_EQ(c.rope_scaling->type, "llama3");
  EXPECT_EQ(c.rope_scaling->original_max_position_embeddings, 8192);
  EXPECT_DOUBLE_EQ(c.rope_scaling->high_freq_factor, 4.0);

  // yarn with DeepSeek's mscale pair: transformers' attention factor = get_mscale(f, m) / get_mscale(f,
  // m_all).
  j["rope_parameters"] = {{"rope_type", "yarn"},
                          {"factor", 40.0},
                          {"mscale", 1.0},
                          {"mscale_all_dim", 0.5},
                          {"original_max_position_embeddings", 4096},
                          {"beta_fast", 16}};
  c = parse_model_config_text(j.dump(), "config.json");
  ASSERT_TRUE(c.rope_scaling->attention_factor.has_value());
  EXPECT_NEAR(*c.rope_scaling->attention_factor, (0.1 * std::log(40.0) + 1) / (0.05 * std::log(40.0) + 1),
              1e-12);
  EXPECT_DOUBLE_EQ(c.rope_scaling->beta_fast, 16.0);
  // yarn without original_max_position_embeddings: transformers fills in max_position_embeddings.
  j["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  c = parse_model_config_text(j.dump(), "config.json");
  EXPECT_EQ(c.rope_scaling->original_max_position_embeddings, 40960);
}

TEST(ModelConfig, MalformedJsonNamesFileAndByte) {
  // The second comma is byte 47 counting from 1 (line 2, column 19).
  const std::string msg = error_of_text("{\"model_type\": \"qwen3_moe\",\n \"vocab_size\": 12,, }");
  EXPECT_NE(msg.find("cfg/config.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("malformed JSON at byte 47"), std::string::npos) << msg;
  EXPECT_NE(error_of_text("").find("malformed JSON"), std::string::npos);
  EXPECT_NE(error_of_text("[1, 2]").find("must hold a JSON object"), std::string::npos);
}

TEST(ModelConfig, MissingFileNamesIt) {
  try {
    parse_model_config("/nonexistent/dir/config.json");
    FAIL() << "expected an error";
  } catch (const xmoe::Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/dir/config.json"), std::string::npos) << e.what();
  }
}

TEST(ModelConfig, UnknownOrMissingArchitecture) {
  nlohmann::json j = qwen3_30b_a3b_v4();
  j["architectures"] = {"LlamaForCausalLM"};
  std::string msg = error_of(j);
  EXPECT_NE(msg.find("field 'architectures'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("unknown architecture 'LlamaForCausalLM'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("supported: Qwen3MoeForCausalLM"), std::string::npos) << msg;

  j.erase("architectures");
  j.erase("model_type");
  msg = error_of(j);
  EXPECT_NE(msg.find("field 'architectures' is missing"), std::string::npos) << msg;
  EXPECT_NE(msg.find("cfg/config.json"), std::string::npos) << msg;

  j["model_type"] = "llama";
  msg = error_of(j);
  EXPECT_NE(msg.find("field 'model_type'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("unknown architecture 'llama'"), std::string::npos) << msg;

  j = qwen3_30b_a3b_v4();
  j["model_type"] = "qwen2_moe";
  EXPECT_NE(error_of(j).find("needs 'qwen3_moe'"), std::string::npos) << error_of(j);
  j["architectures"] = nlohmann::json::array();
  EXPECT_NE(error_of(j).find("non-empty list of strings"), std::string::npos) << error_of(j);
}

// Each case: a field set to a bad value and what the message must say (besides the file and the field).
struct BadField {
  const char* field;
  nlohmann::json value;
  const char* says;
};

TEST(ModelConfig, WrongTypesAndRangesNameTheField) {
  const BadField cases[] = {
      {"hidden_size", "2048", "must be an integer, got string"},
      {"hidden_size", 2048.0, "must be an integer, got number"},
      {"hidden_size", 0, "must be in [1, "},
      {"vocab_size", -5, "must be in [1, "},
      {"vocab_size", 1e30, "must be an integer"},
      {"vocab_size", 99999999999, "must be in [1, 2147483647]"},
      {"num_hidden_layers", true, "must be an integer, got boolean"},
      {"num_attention_heads", 0, "must be in [1, "},
      {"num_key_value_heads", 5, "must divide num_attention_heads = 32"},
      {"head_dim", 127, "must be even"},
      {"num_experts_per_tok", 129, "exceeds num_experts = 128"},
      {"num_experts_per_tok", 0, "must be in [1, "},
      {"moe_intermediate_size", 0, "must be > 0"},
      {"num_experts", -1, "must be in [0, "},
      {"decoder_sparse_step", 0, "must be in [1, "},
      {"mlp_only_layers", {0, 48}, "must be in [0, 47]"},
      {"mlp_only_layers", 3, "must be a list of layer indices"},
      {"norm_topk_prob", 1, "must be true or false, got integer"},
      {"rms_norm_eps", "1e-6", "must be a number, got string"},
      {"rms_norm_eps", 0.0, "must be > 0"},
      {"rope_theta", -1.0, "must be > 0"},
      {"tie_word_embeddings", "false", "must be true or false"},
      {"eos_token_id", "</s>", "must be an integer"},
      {"eos_token_id", {1, "x"}, "must be an integer"},
      {"bos_token_id", -1, "must be in [0, "},
      {"max_position_embeddings", 0, "must be in [1, "},
      {"rope_scaling", "yarn", "must be an object or null"},
      {"hidden_act", "gelu", "is not supported (only 'silu')"},
      {"use_sliding_window", true, "sliding-window attention"},
      {"torch_dtype", 16, "must be a string"},
  };
  for (const auto& bad : cases) {
    nlohmann::json j = qwen3_30b_a3b_v4();
    j[bad.field] = bad.value;
    const std::string msg = error_of(j);
    SCOPED_TRACE(std::string(bad.field) + " = " + bad.value.dump());
    EXPECT_NE(msg.find("cfg/config.json"), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::string("field '") + bad.field), std::string::npos) << msg;
    EXPECT_NE(msg.find(bad.says), std::string::npos) << msg;
  }
}

TEST(ModelConfig, BadRopeParametersNameTheKey) {
  const BadField cases[] = {
      {"rope_scaling", {{"type", "longrope"}, {"factor", 2.0}}, "unsupported type 'longrope'"},
      {"rope_scaling", {{"type", "linear"}}, "field 'rope_scaling.factor' is missing"},
      {"rope_scaling", {{"type", "linear"}, {"factor", "2"}}, "rope_scaling.factor' must be a number"},
      {"rope_scaling",
       {{"rope_type", "llama3"}, {"factor", 8.0}, {"original_max_position_embeddings", 8192}},
       "rope_scaling.low_freq_factor' is missing"},
      {"rope_scaling",
       {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1}, {"high_freq_factor", 4}},
       "rope_scaling.original_max_position_embeddings' is missing"},
      {"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}, {"truncate", false}}, "truncate' = false"},
      {"rope_parameters",
       {{"rope_type", "default"}, {"rope_theta", "1e6"}},
       "rope_parameters.rope_theta' must be"},
      {"rope_parameters", {{"full_attention", {{"rope_type", "default"}}}}, "per-layer-type RoPE"},
      {"rope_parameters",
       {{"rope_type", "default"}, {"partial_rotary_factor", 0.5}},
       "partial_rotary_factor"},
  };
  for (const auto& bad : cases) {
    nlohmann::json j = qwen3_30b_a3b_v4();
    j[bad.field] = bad.value;
    const std::string msg = error_of(j);
    SCOPED_TRACE(bad.value.dump());
    EXPECT_NE(msg.find("cfg/config.json"), std::string::npos) << msg;
    EXPECT_NE(msg.find(bad.says), std::string::npos) << msg;
  }
}

}  // namespace
