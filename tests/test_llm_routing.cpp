// LLM routers against fixtures from tools/make_router_fixtures.py (transcribed Hugging Face / DeepSeek
// PyTorch routing code), plus validation, thread-count independence and tie breaking.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "xmoe/error.hpp"
#include "xmoe/llm_routing.hpp"

namespace {

using xmoe::LlmRouterConfig;
using xmoe::LlmRouterType;

struct Routed {
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

Routed route(const LlmRouterConfig& c, const std::vector<float>& logits, const float* bias = nullptr) {
  const int64_t tokens = static_cast<int64_t>(logits.size()) / c.num_experts;
  Routed r{std::vector<int32_t>(tokens * c.top_k, -1), std::vector<float>(tokens * c.top_k, -1.0f)};
  xmoe::llm_route(c, logits.data(), bias, tokens, r.ids.data(), r.weights.data());
  return r;
}

std::filesystem::path fixture_dir() {
  return std::filesystem::path(XMOE_TEST_DATA_DIR) / "routers";
}

LlmRouterConfig config_from_json(const nlohmann::json& j) {
  LlmRouterConfig c;
  c.type = xmoe::parse_llm_router_type(j.at("type").get<std::string>());
  c.num_experts = j.at("num_experts").get<int>();
  c.top_k = j.at("top_k").get<int>();
  c.norm_topk_prob = j.at("norm_topk_prob").get<bool>();
  c.n_group = j.at("n_group").get<int>();
  c.topk_group = j.at("topk_group").get<int>();
  c.routed_scaling_factor = j.at("routed_scaling_factor").get<double>();
  return c;
}

void check_fixture_file(const std::string& file) {
  const auto path = fixture_dir() / file;
  std::ifstream in(path);
  ASSERT_TRUE(in) << "cannot open " << path
                  << " (regenerate with /usr/bin/python3 tools/make_router_fixtures.py)";
  const auto doc = nlohmann::json::parse(in);
  ASSERT_FALSE(doc.at("cases").empty());
  for (const auto& tc : doc.at("cases")) {
    SCOPED_TRACE(tc.at("name").get<std::string>());
    const LlmRouterConfig c = config_from_json(tc.at("config"));
    // JSON numbers parse as double; the 9-digit values convert back to the exact float32 the oracle used.
    std::vector<float> logits;
    for (double v : tc.at("logits")) logits.push_back(static_cast<float>(v));
    std::vector<float> bias;
    if (!tc.at("correction_bias").is_null())
      for (double v : tc.at("correction_bias")) bias.push_back(static_cast<float>(v));
    const auto expect_ids = tc.at("ids").get<std::vector<int32_t>>();
    const auto expect_w = tc.at("weights").get<std::vector<double>>();
    ASSERT_EQ(logits.size(), static_cast<size_t>(tc.at("tokens").get<int64_t>() * c.num_experts));

    const Routed r = route(c, logits, bias.empty() ? nullptr : bias.data());
    ASSERT_EQ(r.ids.size(), expect_ids.size());
    for (size_t i = 0; i < expect_ids.size(); ++i) {
      EXPECT_EQ(r.ids[i], expect_ids[i]) << "at token " << i / c.top_k << " slot " << i % c.top_k;
      EXPECT_NEAR(r.weights[i], expect_w[i], 1e-6 * std::abs(expect_w[i]))
          << "at token " << i / c.top_k << " slot " << i % c.top_k;
    }
  }
}

TEST(LlmRouting, MatchesQwen3Reference) {
  check_fixture_file("qwen3.json");
}
TEST(LlmRouting, MatchesDeepseekV3Reference) {
  check_fixture_file("deepseek_v3.json");
}
TEST(LlmRouting, MatchesKimiK2Reference) {
  check_fixture_file("kimi_k2.json");
}
TEST(LlmRouting, MatchesGptOssReference) {
  check_fixture_file("gpt_oss.json");
}
TEST(LlmRouting, MatchesReferenceOnExactTies) {
  check_fixture_file("ties.json");
}

TEST(LlmRouting, ParsesOwnAndHuggingFaceNames) {
  EXPECT_EQ(xmoe::parse_llm_router_type("qwen3"), LlmRouterType::qwen3);
  EXPECT_EQ(xmoe::parse_llm_router_type("qwen3_moe"), LlmRouterType::qwen3);
  EXPECT_EQ(xmoe::parse_llm_router_type("deepseek_v3"), LlmRouterType::deepseek_v3);
  EXPECT_EQ(xmoe::parse_llm_router_type("kimi_k2"), LlmRouterType::kimi_k2);
  EXPECT_EQ(xmoe::parse_llm_router_type("gpt_oss"), LlmRouterType::gpt_oss);
  try {
    xmoe::parse_llm_router_type("mixtral");
    FAIL() << "expected xmoe::Error";
  } catch (const xmoe::Error& e) {
    EXPECT_NE(std::string(e.what()).find("llm_router.type"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("mixtral"), std::string::npos) << e.what();
  }
}

// Expects validate() to throw with a message containing every fragment.
void expect_invalid(const LlmRouterConfig& c, const std::vector<std::string>& fragments) {
  try {
    xmoe::validate(c);
    ADD_FAILURE() << "expected xmoe::Error mentioning " << fragments.front();
  } catch (const xmoe::Error& e) {
    for (const auto& f : fragments) EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << e.what();
  }
}

LlmRouterConfig deepseek_config() {
  LlmRouterConfig c;
  c.type = LlmRouterType::deepseek_v3;
  c.num_experts = 256;
  c.top_k = 8;
  c.n_group = 8;
  c.topk_group = 4;
  c.routed_scaling_factor = 2.5;
  return c;
}

TEST(LlmRouting, ValidationNamesTheField) {
  LlmRouterConfig q;
  q.num_experts = 8;
  q.top_k = 9;
  expect_invalid(q, {"llm_router.top_k: must be in [1, num_experts=8], got 9"});
  q.top_k = 0;
  expect_invalid(q, {"llm_router.top_k", "got 0"});
  q.num_experts = 0;
  q.top_k = 1;
  expect_invalid(q, {"llm_router.num_experts", "got 0"});
  q.num_experts = 8;
  q.routed_scaling_factor = 0.0;
  expect_invalid(q, {"llm_router.routed_scaling_factor"});
  q.routed_scaling_factor = std::nan("");
  expect_invalid(q, {"llm_router.routed_scaling_factor"});
  q.routed_scaling_factor = INFINITY;
  expect_invalid(q, {"llm_router.routed_scaling_factor"});

  xmoe::validate(deepseek_config());
  auto d = deepseek_config();
  d.n_group = 0;
  expect_invalid(d, {"llm_router.n_group", "got 0"});
  d.n_group = 6;  // does not divide 256
  expect_invalid(d, {"llm_router.n_group", "got 6"});
  d.n_group = 256;  // one expert per group
  d.topk_group = 8;
  expect_invalid(d, {"llm_router.n_group"});
  d = deepseek_config();
  d.topk_group = 0;
  expect_invalid(d, {"llm_router.topk_group", "got 0"});
  d.topk_group = 9;
  expect_invalid(d, {"llm_router.topk_group", "got 9"});
  d.topk_group = 1;  // 32 experts survive
  d.top_k = 33;
  expect_invalid(d, {"llm_router.top_k", "32", "got 33"});

  // Only DeepSeek-V3 reads the group fields.
  auto k = deepseek_config();
  k.type = LlmRouterType::kimi_k2;
  k.n_group = 7;
  k.top_k = 200;
  xmoe::validate(k);
}

TEST(LlmRouting, RouteRejectsBadArguments) {
  LlmRouterConfig c;
  c.num_experts = 4;
  c.top_k = 2;
  std::vector<float> logits(8, 0.0f);
  std::vector<int32_t> ids(4);
  std::vector<float> w(4);
  EXPECT_THROW(xmoe::llm_route(c, logits.data(), nullptr, -1, ids.data(), w.data()), xmoe::Error);
  EXPECT_THROW(xmoe::llm_route(c, nullptr, nullptr, 2, ids.data(), w.data()), xmoe::Error);
  EXPECT_THROW(xmoe::llm_route(c, logits.data(), nullptr, 2, nullptr, w.data()), xmoe::Error);
  c.top_k = 5;
  EXPECT_THROW(xmoe::llm_route(c, logits.data(), nullptr, 2, ids.data(), w.data()), xmoe::Error);
  c.top_k = 2;
  xmoe::llm_route(c, nullptr, nullptr, 0, nullptr, nullptr);  // no tokens, nothing to touch
}

TEST(LlmRouting, ResultsDoNotDependOnThreadCount) {
  const int saved = omp_get_max_threads();
  // Deterministic pseudo-random logits (no <random> distribution, whose output is implementation-defined),
  // quantised a little so some exact ties occur as well.
  const int64_t tokens = 257;
  auto make_logits = [&](int E) {
    std::vector<float> v(tokens * E);
    uint64_t state = 0x9e3779b97f4a7c15ull;
    for (auto& x : v) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      x = static_cast<float>(static_cast<int>((state >> 40) % 4001) - 2000) / 256.0f;
    }
    return v;
  };
  std::vector<LlmRouterConfig> configs;
  for (auto type : {LlmRouterType::qwen3, LlmRouterType::kimi_k2, LlmRouterType::gpt_oss}) {
    LlmRouterConfig c;
    c.type = type;
    c.num_experts = 384;
    c.top_k = 8;
    configs.push_back(c);
  }
  configs.push_back(deepseek_config());
  for (const auto& c : configs) {
    SCOPED_TRACE(static_cast<int>(c.type));
    const auto logits = make_logits(c.num_experts);
    std::vector<float> bias(c.num_experts);
    for (int e = 0; e < c.num_experts; ++e) bias[e] = static_cast<float>(e % 7) * 0.01f;
    omp_set_num_threads(1);
    const Routed one = route(c, logits, bias.data());
    omp_set_num_threads(2);
    const Routed two = route(c, logits, bias.data());
    omp_set_num_threads(3);
    const Routed three = route(c, logits, bias.data());
    EXPECT_EQ(one.ids, two.ids);
    EXPECT_EQ(one.ids, three.ids);
    // Bitwise equality: the same computation must run whatever thread a token lands on.
    EXPECT_EQ(0, std::memcmp(one.weights.data(), two.weights.data(), one.weights.size() * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(one.weights.data(), three.weights.data(), one.weights.size() * sizeof(float)));
  }
  omp_set_num_threads(saved);
}

TEST(LlmRouting, TiesGoToTheLowerIndex) {
  for (auto type :
       {LlmRouterType::qwen3, LlmRouterType::deepseek_v3, LlmRouterType::kimi_k2, LlmRouterType::gpt_oss}) {
    SCOPED_TRACE(static_cast<int>(type));
    LlmRouterConfig c;
    c.type = type;
    c.num_experts = 8;
    c.top_k = 3;
    // Experts 1, 3, 4, 6 share the best logit; 0 and 7 share the second best.
    const std::vector<float> logits = {0.5f, 1.0f, -1.0f, 1.0f, 1.0f, -2.0f, 1.0f, 0.5f};
    const Routed r = route(c, logits);
    EXPECT_EQ(r.ids, (std::vector<int32_t>{1, 3, 4}));
    EXPECT_FLOAT_EQ(r.weights[0], r.weights[1]);
    EXPECT_FLOAT_EQ(r.weights[1], r.weights[2]);

    c.top_k = 6;
    EXPECT_EQ(route(c, logits).ids, (std::vector<int32_t>{1, 3, 4, 6, 0, 7}));
  }

  // Equal group scores keep the lower groups: 4 identical groups of 4, keep 2, so only experts 0..7 compete.
  LlmRouterConfig d;
  d.type = LlmRouterType::deepseek_v3;
  d.num_experts = 16;
  d.top_k = 4;
  d.n_group = 4;
  d.topk_group = 2;
  const std::vector<float> group = {0.0f, 2.0f, 1.0f, 2.0f};
  std::vector<float> logits;
  for (int g = 0; g < 4; ++g) logits.insert(logits.end(), group.begin(), group.end());
  EXPECT_EQ(route(d, logits).ids, (std::vector<int32_t>{1, 3, 5, 7}));
}

TEST(LlmRouting, DeepseekWeightsUseUnbiasedSigmoidAndScale) {
  LlmRouterConfig c;
  c.type = LlmRouterType::kimi_k2;
  c.num_experts = 4;
  c.top_k = 2;
  c.routed_scaling_factor = 2.827;
  c.norm_topk_prob = false;
  const std::vector<float> logits = {0.0f, 1.0f, 2.0f, 3.0f};
  // The bias promotes expert 0 to first place but its weight stays sigmoid(0) * scale.
  const std::vector<float> bias = {10.0f, 0.0f, 0.0f, 0.0f};
  const Routed r = route(c, logits, bias.data());
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 3}));
  const double s3 = 1.0 / (1.0 + std::exp(-3.0));
  EXPECT_NEAR(r.weights[0], 0.5 * 2.827, 1e-6);
  EXPECT_NEAR(r.weights[1], s3 * 2.827, 1e-6);
  c.norm_topk_prob = true;
  const Routed n = route(c, logits, bias.data());
  EXPECT_NEAR(n.weights[0], 0.5 / (0.5 + s3) * 2.827, 1e-6);
  EXPECT_NEAR(n.weights[1], s3 / (0.5 + s3) * 2.827, 1e-6);
}

}  // namespace
