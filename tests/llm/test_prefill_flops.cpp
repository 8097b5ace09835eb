// app/prefill_flops (the FLOP count behind `xmoe generate --measure-bandwidth`'s GFLOP/s) against an
// independent count for every registered architecture: the linears as Σ m·n·k over the weight shapes the
// architecture's checkpoint planner lists (what init-model writes), and the attention written out here from
// config.json's own head dims and layer types.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "llm/arch/architecture.hpp"
#include "prefill_flops.hpp"

namespace xmoe::llm {
namespace {

// The layer index of "model.layers.<i>.…", or -1.
int layer_of(const std::string& name) {
  const std::string p = "model.layers.";
  return name.rfind(p, 0) == 0 ? std::stoi(name.substr(p.size())) : -1;
}

// Multiply-adds of the linears a prefill of t tokens runs: every 2-D weight of a decoder layer once per
// token (projections, router, shared experts, dense MLPs), the stacked routed experts [E, ·, ·] top_k / E of
// their size per token, the lm_head (or the tied embedding) once. Left out: the embedding lookup, biases, MTP
// layers (planned after the decoder layers, never run) and DeepSeek-V3.2's indexer (not run up to
// index_topk positions).
double planned_linear_macs(const ModelConfig& c, double t) {
  double per_token = 0, once = 0, embedding = 0;
  bool lm_head = false;
  for (const PlannedTensor& p : architecture_of(c).tensors(c, ExpertLayout::fused)) {
    const auto n = static_cast<double>(p.numel());
    if (p.name == "model.embed_tokens.weight") embedding = n;
    if (p.name == "lm_head.weight") {
      once += n;
      lm_head = true;
    }
    const int layer = layer_of(p.name);
    const bool bias = p.name.size() >= 4 && p.name.compare(p.name.size() - 4, 4, "bias") == 0;  // [E, n] too
    if (layer < 0 || layer >= c.num_hidden_layers || bias || p.name.find(".indexer.") != std::string::npos)
      continue;
    if (p.shape.size() == 3) per_token += n * c.num_experts_per_tok / c.num_experts;
    if (p.shape.size() == 2) per_token += n;
  }
  return per_token * t + (lm_head ? once : embedding);
}

// Multiply-adds of attention itself, from config.json: per query head, q·k over the key width and p·v over
// the value width, for every (position, key it sees) pair.
double attention_macs(const nlohmann::json& j, double t) {
  const double heads = j["num_attention_heads"];
  double key_width, value_width;
  if (j.contains("kv_lora_rank")) {  // MLA, expanded: k = [k_nope, k_pe], v of v_head_dim
    key_width = double(j["qk_nope_head_dim"]) + double(j["qk_rope_head_dim"]);
    value_width = j["v_head_dim"];
  } else {
    key_width = value_width = j.contains("head_dim") && !j["head_dim"].is_null()
                                  ? double(j["head_dim"])
                                  : double(j["hidden_size"]) / heads;
  }
  double macs = 0;
  const int layers = j["num_hidden_layers"];
  for (int i = 0; i < layers; ++i) {
    const bool sliding = j.contains("layer_types") && j["layer_types"][i] == "sliding_attention";
    double pairs = 0;
    for (double pos = 0; pos < t; ++pos)
      pairs += sliding ? std::min(pos + 1, double(j["sliding_window"])) : pos + 1;
    macs += heads * (key_width + value_width) * pairs;
  }
  return macs;
}

TEST(PrefillFlops, MatchesThePlannedWeightsAndWrittenOutAttention) {
  const std::string data = XMOE_TEST_DATA_DIR;
  const std::string configs = std::string(XMOE_TEST_DATA_DIR) + "/../../configs/";
  std::set<std::string> architectures;
  for (const std::string& path :
       {configs + "qwen3-30b-a3b-8layers.json", configs + "gpt-oss-20b-4layers.json",
        configs + "deepseek-v3-2layers.json", configs + "kimi-k2-2layers.json",
        configs + "glm-4.5-air-2layers.json", data + "/models/glm4-moe-lite-a/config.json",
        data + "/deepseek_v3/ds-noqlora/config.json", data + "/deepseek_v3/ds-v32/config.json",
        data + "/models/tied-sparse/config.json"}) {
    const ModelConfig c = parse_model_config(path);
    architectures.insert(c.architecture);
    std::ifstream in(path);
    const nlohmann::json j = nlohmann::json::parse(in);
    for (const int64_t t : {1, 7, 300}) {
      const double want = 2.0 * (planned_linear_macs(c, double(t)) + attention_macs(j, double(t)));
      EXPECT_NEAR(app::prefill_flops(c, t), want, want * 1e-12) << path << ", " << t << " tokens";
    }
  }
  // Every registered architecture took part.
  for (const Architecture* a : llm::architectures())
    EXPECT_EQ(architectures.count(std::string(a->name())), 1u) << a->name();
}

}  // namespace
}  // namespace xmoe::llm
