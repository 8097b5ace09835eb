// The sampler against transformers' logits processors (tests/data/sampler, tools/make_sampler_fixtures.py),
// plus the statistics of its draws.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <tuple>

#include "llm/sampler.hpp"
#include "xmoe/error.hpp"

namespace xmoe::llm {
namespace {

nlohmann::json load_cases() {
  std::ifstream in(std::string(XMOE_TEST_DATA_DIR) + "/sampler/processors.json");
  EXPECT_TRUE(in.good());
  return nlohmann::json::parse(in);
}

SamplingParams params_of(const nlohmann::json& p) {
  SamplingParams s;
  s.temperature = p.value("temperature", 1.0);
  s.top_k = p.value("top_k", 0);
  s.top_p = p.value("top_p", 1.0);
  s.min_p = p.value("min_p", 0.0);
  s.repetition_penalty = p.value("repetition_penalty", 1.0);
  s.presence_penalty = p.value("presence_penalty", 0.0);
  s.frequency_penalty = p.value("frequency_penalty", 0.0);
  return s;
}

PenaltyState penalties_of(const nlohmann::json& c) {
  PenaltyState state;
  state.add_prompt(c["prompt"].get<std::vector<int32_t>>());
  for (int32_t t : c["output"].get<std::vector<int32_t>>()) state.add_generated(t);
  return state;
}

TEST(Sampler, MatchesTransformersLogitsProcessors) {
  const nlohmann::json fixture = load_cases();
  ASSERT_GE(fixture["cases"].size(), 20u);
  for (const auto& c : fixture["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const SamplingParams params = params_of(c["params"]);
    std::vector<float> logits = c["logits"].get<std::vector<float>>();
    penalties_of(c).apply(params, logits);
    if (c.contains("greedy_token")) {
      EXPECT_EQ(argmax_token(logits), c["greedy_token"].get<int32_t>());
      continue;
    }
    const TokenDistribution dist = filtered_distribution(logits, params);
    std::map<int32_t, double> ours;
    for (size_t i = 0; i < dist.tokens.size(); ++i) ours[dist.tokens[i]] = dist.probs[i];
    const auto expected = c["probs"].get<std::vector<double>>();
    size_t kept = 0;
    for (size_t t = 0; t < expected.size(); ++t) {
      const bool in_ours = ours.count(static_cast<int32_t>(t)) > 0;
      EXPECT_EQ(in_ours, expected[t] > 0) << "token " << t;
      if (expected[t] > 0) ++kept;
      EXPECT_NEAR(in_ours ? ours[static_cast<int32_t>(t)] : 0.0, expected[t], 1e-6) << "token " << t;
    }
    EXPECT_EQ(dist.tokens.size(), kept);
  }
}

TEST(Sampler, GreedyIgnoresFiltersAndBreaksTiesByLowestId) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f};
  SamplingParams params;
  params.temperature = 0;
  params.top_k = 1;
  Sampler sampler(params, 7);
  std::vector<float> row = logits;
  EXPECT_EQ(sampler.sample(row, PenaltyState{}, 0), 1);
}

// The plain definition of greedy: one scan keeping the first strictly larger logit (NaN never is).
int32_t argmax_reference(const std::vector<float>& logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[static_cast<size_t>(best)]) best = static_cast<int32_t>(i);
  return best;
}

TEST(Sampler, ArgmaxMatchesAPlainScan) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::uniform_int_distribution<int> coin(0, 99);
  // Vocabularies around the 16-lane blocks, a real one; values with few distinct levels (many ties), ±0,
  // ±inf and NaN sprinkled in, the maximum anywhere.
  for (const size_t vocab :
       {size_t{1}, size_t{2}, size_t{15}, size_t{16}, size_t{17}, size_t{33}, size_t{1000}, size_t{151936}}) {
    for (int trial = 0; trial < 40; ++trial) {
      std::vector<float> logits(vocab);
      const bool coarse = trial % 2 == 0;
      for (float& l : logits) {
        const int c = coin(rng);
        l = c < 3 ? NAN : c < 5 ? -INFINITY : c < 7 ? 0.0f : c < 9 ? -0.0f : normal(rng);
        if (coarse && std::isfinite(l)) l = std::round(l);
      }
      if (trial % 5 == 1) logits[0] = NAN;
      if (trial % 5 == 2) logits[vocab - 1] = INFINITY;
      if (trial % 5 == 3)
        for (float& l : logits) l = std::isnan(l) ? l : (coin(rng) < 50 ? 0.0f : -0.0f);
      if (trial % 5 == 4)
        for (float& l : logits) l = NAN;
      SCOPED_TRACE(::testing::Message() << "vocab " << vocab << ", trial " << trial);
      EXPECT_EQ(argmax_token(logits), argmax_reference(logits));
    }
  }
}

// The plain definition of top-p: a full sort, then the HF rule on ascending cumulative probabilities.
std::vector<int32_t> top_p_reference(const std::vector<float>& logits, double top_p) {
  std::vector<int32_t> order;
  for (size_t i = 0; i < logits.size(); ++i)
    if (logits[i] != -INFINITY) order.push_back(static_cast<int32_t>(i));
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] < logits[b]; });
  double total = 0;
  for (int32_t t : order) total += std::exp(static_cast<double>(logits[t]));
  std::vector<int32_t> kept;
  double ascending = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    ascending += std::exp(static_cast<double>(logits[order[i]])) / total;
    if (ascending > 1 - top_p || i + 1 == order.size()) kept.push_back(order[i]);
  }
  std::sort(kept.begin(), kept.end());
  return kept;
}

TEST(Sampler, TopPOnALargeVocabularyMatchesAFullSort) {
  std::mt19937 gen(5);
  for (const auto& [scale, top_p] :
       {std::pair{3.0f, 0.3}, {3.0f, 0.9}, {3.0f, 0.999}, {0.5f, 0.95}, {12.0f, 0.8}, {40.0f, 0.99}}) {
    std::normal_distribution<float> normal(0.0f, scale);
    std::vector<float> logits(20000);
    for (float& l : logits) l = normal(gen);
    logits[17] = -INFINITY;  // masked tokens never come back
    SamplingParams params;
    params.top_p = top_p;
    TokenDistribution dist = filtered_distribution(logits, params);
    std::sort(dist.tokens.begin(), dist.tokens.end());
    EXPECT_EQ(dist.tokens, top_p_reference(logits, top_p)) << "scale " << scale << ", top_p " << top_p;
  }
}

// The plain definition of top-k: every token whose logit / temperature is at least the k-th largest such
// value (ties with it stay), probabilities by softmax over them.
std::map<int32_t, double> top_k_reference(const std::vector<float>& logits, int k, double temperature) {
  std::vector<double> scaled;
  for (float l : logits)
    if (l != -INFINITY) scaled.push_back(static_cast<double>(l) / temperature);
  std::sort(scaled.begin(), scaled.end(), std::greater<>());
  const double kth = scaled[std::min(scaled.size(), static_cast<size_t>(k)) - 1];
  std::map<int32_t, double> kept;
  double top = -INFINITY, total = 0;
  for (size_t i = 0; i < logits.size(); ++i)
    if (logits[i] != -INFINITY && static_cast<double>(logits[i]) / temperature >= kth)
      top = std::max(top, static_cast<double>(logits[i]) / temperature);
  for (size_t i = 0; i < logits.size(); ++i) {
    const double d = static_cast<double>(logits[i]) / temperature;
    if (logits[i] == -INFINITY || d < kth) continue;
    kept[static_cast<int32_t>(i)] = std::exp(d - top);
    total += kept[static_cast<int32_t>(i)];
  }
  for (auto& [t, p] : kept) p /= total;
  return kept;
}

// The partial selection of the k largest (sampler.cpp) against a full sort, on a vocabulary of Qwen3's size
// with repeated values at the cut, masked tokens and fewer finite logits than k.
TEST(Sampler, TopKOnALargeVocabularyMatchesAFullSort) {
  std::mt19937 gen(11);
  for (const auto& [k, temperature, quantum] :
       {std::tuple{20, 0.6, 0.0f}, {1, 1.0, 0.0f}, {50, 1.3, 0.25f}, {20, 0.6, 0.5f}, {1000, 2.0, 0.0f}}) {
    SCOPED_TRACE(testing::Message() << "k " << k << ", temperature " << temperature << ", quantum "
                                    << quantum);
    std::normal_distribution<float> normal(0.0f, 3.0f);
    std::vector<float> logits(151936);
    for (float& l : logits) {
      l = normal(gen);
      if (quantum > 0) l = std::round(l / quantum) * quantum;  // many logits equal to the k-th
    }
    for (size_t i = 5; i < logits.size(); i += 97) logits[i] = -INFINITY;
    SamplingParams params;
    params.temperature = temperature;
    params.top_k = k;
    const TokenDistribution dist = filtered_distribution(logits, params);
    const std::map<int32_t, double> want = top_k_reference(logits, k, temperature);
    ASSERT_EQ(dist.tokens.size(), want.size());
    for (size_t i = 0; i < dist.tokens.size(); ++i) {
      ASSERT_EQ(want.count(dist.tokens[i]), 1u) << "token " << dist.tokens[i];
      EXPECT_NEAR(dist.probs[i], want.at(dist.tokens[i]), 1e-12);
    }
    // Most probable first: the draw walks the survivors in an order fixed by the logits.
    for (size_t i = 1; i < dist.tokens.size(); ++i)
      EXPECT_GE(logits[static_cast<size_t>(dist.tokens[i - 1])], logits[static_cast<size_t>(dist.tokens[i])]);
  }
  // Fewer finite logits than k: all of them.
  std::vector<float> few(1000, -INFINITY);
  few[3] = 1.0f, few[900] = 2.0f;
  SamplingParams params;
  params.top_k = 20;
  EXPECT_EQ(filtered_distribution(few, params).tokens.size(), 2u);
  // A temperature that maps neighbouring floats to one double (overflow to inf): the full path decides.
  std::vector<float> huge = {3e38f, std::nextafter(3e38f, 0.0f), 1.0f, 2.0f};
  params.temperature = 1e-300;
  params.top_k = 1;
  std::vector<int32_t> tokens = filtered_distribution(huge, params).tokens;
  std::sort(tokens.begin(), tokens.end());
  EXPECT_EQ(tokens, (std::vector<int32_t>{0, 1}));
  EXPECT_THROW(filtered_distribution(std::vector<float>{1.0f, NAN, 2.0f}, params), Error);
  // A NaN or +inf far past the first k values (where whole blocks are passed over) is still found.
  for (const float bad : {NAN, INFINITY}) {
    std::vector<float> row(5000, 0.5f);
    row[4321] = bad;
    params.temperature = 1.0;
    params.top_k = 20;
    EXPECT_THROW(filtered_distribution(row, params), Error);
  }
}

// Pearson's chi-square of `draws` samples against the distribution, with the Wilson-Hilferty approximation
// of the 0.999 quantile: a correct sampler fails one run in a thousand, and the seed is fixed.
TEST(Sampler, DrawFrequenciesFollowTheDistribution) {
  const nlohmann::json fixture = load_cases();
  for (const auto& c : fixture["cases"]) {
    const std::string name = c["name"];
    if (name != "all_filters" && name != "plain" && name != "everything") continue;
    SCOPED_TRACE(name);
    const SamplingParams params = params_of(c["params"]);
    const PenaltyState penalties = penalties_of(c);
    const auto expected = c["probs"].get<std::vector<double>>();
    const Sampler sampler(params, 1234);
    const int draws = 100000;
    std::vector<int> counts(expected.size(), 0);
    for (int i = 0; i < draws; ++i) {
      std::vector<float> row = c["logits"].get<std::vector<float>>();
      const int32_t t = sampler.sample(row, penalties, static_cast<uint64_t>(i));
      ASSERT_GT(expected.at(static_cast<size_t>(t)), 0.0) << "drew filtered token " << t;
      ++counts[static_cast<size_t>(t)];
    }
    double chi2 = 0;
    int df = -1;
    for (size_t t = 0; t < expected.size(); ++t) {
      if (expected[t] <= 0) continue;
      const double e = expected[t] * draws;
      chi2 += (counts[t] - e) * (counts[t] - e) / e;
      ++df;
    }
    ASSERT_GT(df, 0);
    const double z = 3.09, a = 2.0 / (9.0 * df);
    const double critical = df * std::pow(1 - a + z * std::sqrt(a), 3);
    EXPECT_LT(chi2, critical) << "df " << df;
  }
}

TEST(Sampler, SeedReproducesAndDifferentSeedsDiffer) {
  std::vector<float> logits(64);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<float>(std::sin(0.37 * i));
  SamplingParams params;
  params.temperature = 1.3;
  auto run = [&](uint64_t seed) {
    const Sampler sampler(params, seed);
    std::vector<int32_t> out;
    for (uint64_t i = 0; i < 50; ++i) {
      std::vector<float> row = logits;
      out.push_back(sampler.sample(row, PenaltyState{}, i));
    }
    return out;
  };
  EXPECT_EQ(run(42), run(42));
  EXPECT_NE(run(42), run(43));
}

TEST(Sampler, PenaltiesSkipIdsOutsideTheVocabulary) {
  PenaltyState state;
  state.add_prompt(std::vector<int32_t>{-3, 1, 999});
  state.add_generated(1);
  state.add_generated(1);
  SamplingParams params;
  params.repetition_penalty = 2.0;
  params.frequency_penalty = 0.5;
  params.presence_penalty = 0.25;
  std::vector<float> logits = {1.0f, 3.0f, -1.0f};
  state.apply(params, logits);
  EXPECT_FLOAT_EQ(logits[0], 1.0f);
  EXPECT_FLOAT_EQ(logits[1], 3.0f / 2 - 0.5f * 2 - 0.25f);
  EXPECT_FLOAT_EQ(logits[2], -1.0f);
}

TEST(Sampler, RejectsBadParametersAndLogits) {
  auto bad = [](auto change) {
    SamplingParams p;
    change(p);
    return p;
  };
  EXPECT_THROW(bad([](SamplingParams& p) { p.temperature = -1; }).validate(), Error);
  EXPECT_THROW(bad([](SamplingParams& p) { p.top_k = -2; }).validate(), Error);
  EXPECT_THROW(bad([](SamplingParams& p) { p.top_p = 0; }).validate(), Error);
  EXPECT_THROW(bad([](SamplingParams& p) { p.top_p = 1.5; }).validate(), Error);
  EXPECT_THROW(bad([](SamplingParams& p) { p.min_p = 2; }).validate(), Error);
  EXPECT_THROW(bad([](SamplingParams& p) { p.repetition_penalty = 0; }).validate(), Error);
  EXPECT_THROW(Sampler(bad([](SamplingParams& p) { p.top_p = -0.1; }), 1), Error);
  try {
    bad([](SamplingParams& p) { p.top_p = 0; }).validate();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("top_p"), std::string::npos);
  }
  const std::vector<float> nan_row = {0.0f, NAN};
  EXPECT_THROW(filtered_distribution(nan_row, SamplingParams{}), Error);
  const std::vector<float> masked = {-INFINITY, -INFINITY};
  EXPECT_THROW(filtered_distribution(masked, SamplingParams{}), Error);
}

}  // namespace
}  // namespace xmoe::llm
