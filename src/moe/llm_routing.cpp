// Forward-only routers of MoE LLMs. Each follows its model's reference PyTorch code:
//   qwen3        transformers Qwen3MoeSparseMoeBlock.forward (softmax in f32, topk, optional renormalise)
//   deepseek_v3  transformers DeepseekV3TopkRouter (topk_method "noaux_tc") and Gate.forward of
//                deepseek-ai/DeepSeek-V3 inference/model.py for the group mask
//   kimi_k2      the DeepSeek-V3 router (Kimi K2 ships DeepseekV3ForCausalLM code) with a single group
//   gpt_oss      transformers GptOssTopKRouter.forward (topk on logits, softmax over the k selected)
// tools/make_router_fixtures.py transcribes the same code and produces the fixtures the tests compare to.
#include "xmoe/llm_routing.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "xmoe/error.hpp"

namespace xmoe {

LlmRouterType parse_llm_router_type(const std::string& name) {
  // Both our names and the Hugging Face config.json model_type spellings are accepted, so a config's
  // model_type can be passed through unchanged.
  if (name == "qwen3" || name == "qwen3_moe") return LlmRouterType::qwen3;
  if (name == "deepseek_v3") return LlmRouterType::deepseek_v3;
  if (name == "kimi_k2") return LlmRouterType::kimi_k2;
  if (name == "gpt_oss") return LlmRouterType::gpt_oss;
  XMOE_CHECK(false, "llm_router.type: unknown router \"", name,
             "\" (expected qwen3, qwen3_moe, deepseek_v3, kimi_k2 or gpt_oss)");
  return LlmRouterType::qwen3;  // unreachable: keeps -Wreturn-type quiet
}

void validate(const LlmRouterConfig& c) {
  XMOE_CHECK(c.num_experts > 0, "llm_router.num_experts: must be > 0, got ", c.num_experts);
  XMOE_CHECK(c.top_k >= 1 && c.top_k <= c.num_experts,
             "llm_router.top_k: must be in [1, num_experts=", c.num_experts, "], got ", c.top_k);
  XMOE_CHECK(std::isfinite(c.routed_scaling_factor) && c.routed_scaling_factor > 0,
             "llm_router.routed_scaling_factor: must be finite and > 0, got ", c.routed_scaling_factor);
  // Only DeepSeek-V3 reads the group fields; Kimi K2 always runs with a single group.
  if (c.type != LlmRouterType::deepseek_v3) return;
  XMOE_CHECK(c.n_group > 0 && c.num_experts % c.n_group == 0,
             "llm_router.n_group: must be > 0 and divide num_experts=", c.num_experts, ", got ", c.n_group);
  const int group_size = c.num_experts / c.n_group;
  // A group's score is the sum of its two best experts, which does not exist for one-expert groups (the
  // reference topk(2) raises there too).
  XMOE_CHECK(c.n_group == 1 || group_size >= 2,
             "llm_router.n_group: groups need at least 2 experts, got n_group=", c.n_group,
             " for num_experts=", c.num_experts);
  XMOE_CHECK(c.topk_group >= 1 && c.topk_group <= c.n_group,
             "llm_router.topk_group: must be in [1, n_group=", c.n_group, "], got ", c.topk_group);
  XMOE_CHECK(c.top_k <= c.topk_group * group_size,
             "llm_router.top_k: must be <= topk_group*(num_experts/n_group)=", c.topk_group * group_size,
             ", got ", c.top_k);
}

namespace {

// Tokens from which llm_route splits its tokens over the OpenMP team.
constexpr int64_t kTokensPerTeam = 64;

// Selection order: higher score first, equal scores to the lower index. NaN ranks above every number, as
// in torch.topk; this keeps the order a strict weak ordering so the sort below stays well defined.
bool ranks_before(float a, int ia, float b, int ib) {
  const bool na = std::isnan(a), nb = std::isnan(b);
  if (na || nb) return na != nb ? na : ia < ib;
  return a > b || (a == b && ia < ib);
}

// Writes into out[0..k) the k best of candidates (indices into score), best first. The order is total,
// so the result depends only on the scores, never on the thread count or the sort's internals.
void select_top_k(const float* score, std::vector<int>& candidates, int k, int32_t* out) {
  std::partial_sort(candidates.begin(), candidates.begin() + k, candidates.end(),
                    [score](int a, int b) { return ranks_before(score[a], a, score[b], b); });
  std::copy(candidates.begin(), candidates.begin() + k, out);
}

// Per-thread working storage, sized once per parallel region instead of once per token.
struct Scratch {
  std::vector<float> score;
  std::vector<float> group_score;
  std::vector<int> candidates;
  std::vector<int32_t> groups;
};

void route_qwen3(const LlmRouterConfig& c, const float* x, Scratch& s, int32_t* ids, float* w) {
  const int E = c.num_experts, k = c.top_k;
  // Numerically stable softmax (subtract the max), as torch's softmax kernel does.
  float mx = x[0];
  for (int e = 1; e < E; ++e) mx = std::max(mx, x[e]);
  float sum = 0.0f;
  for (int e = 0; e < E; ++e) sum += (s.score[e] = std::exp(x[e] - mx));
  for (int e = 0; e < E; ++e) s.score[e] /= sum;
  // Selection is on the probabilities, not the logits, because rounding can make two different logits
  // equally probable and the reference then breaks the tie on p.
  s.candidates.resize(E);
  std::iota(s.candidates.begin(), s.candidates.end(), 0);
  select_top_k(s.score.data(), s.candidates, k, ids);
  float top_sum = 0.0f;
  for (int j = 0; j < k; ++j) top_sum += (w[j] = s.score[ids[j]]);
  if (c.norm_topk_prob)
    for (int j = 0; j < k; ++j) w[j] /= top_sum;
}

void route_deepseek(const LlmRouterConfig& c, int n_group, int topk_group, const float* x, const float* bias,
                    Scratch& s, int32_t* ids, float* w) {
  const int E = c.num_experts, k = c.top_k, group_size = E / n_group;
  // s.score holds the biased choice score c = sigmoid(x) + bias; the unbiased sigmoid is recomputed for
  // the k winners only, since the weights ignore the bias.
  for (int e = 0; e < E; ++e) s.score[e] = 1.0f / (1.0f + std::exp(-x[e])) + (bias ? bias[e] : 0.0f);

  s.candidates.clear();
  if (topk_group == n_group) {
    // Every group survives, so the group stage cannot change the outcome.
    for (int e = 0; e < E; ++e) s.candidates.push_back(e);
  } else {
    for (int g = 0; g < n_group; ++g) {
      const float* gs = s.score.data() + static_cast<size_t>(g) * group_size;
      int i1 = 0;
      for (int i = 1; i < group_size; ++i)
        if (ranks_before(gs[i], i, gs[i1], i1)) i1 = i;
      int i2 = i1 == 0 ? 1 : 0;
      for (int i = 0; i < group_size; ++i)
        if (i != i1 && ranks_before(gs[i], i, gs[i2], i2)) i2 = i;
      s.group_score[g] = gs[i1] + gs[i2];
    }
    std::vector<int>& order = s.candidates;  // borrowed for the group ranking, refilled below
    order.resize(n_group);
    std::iota(order.begin(), order.end(), 0);
    select_top_k(s.group_score.data(), order, topk_group, s.groups.data());
    // Experts of dropped groups are left out of the candidates, which is what DeepSeek's inference code
    // and vLLM get by masking them with -inf. Some transformers versions mask with 0.0 instead; that only
    // differs when every remaining c is below 0, letting a masked expert win there.
    std::sort(s.groups.begin(), s.groups.begin() + topk_group);
    s.candidates.clear();
    for (int j = 0; j < topk_group; ++j)
      for (int i = 0; i < group_size; ++i) s.candidates.push_back(s.groups[j] * group_size + i);
  }
  select_top_k(s.score.data(), s.candidates, k, ids);

  float sum = 0.0f;
  for (int j = 0; j < k; ++j) sum += (w[j] = 1.0f / (1.0f + std::exp(-x[ids[j]])));
  // The 1e-20 is transformers' guard against an all-zero denominator; it is below f32 resolution otherwise.
  const float denom = c.norm_topk_prob ? sum + 1e-20f : 1.0f;
  const float scale = static_cast<float>(c.routed_scaling_factor);
  for (int j = 0; j < k; ++j) w[j] = w[j] / denom * scale;
}

void route_gpt_oss(const LlmRouterConfig& c, const float* x, Scratch& s, int32_t* ids, float* w) {
  const int k = c.top_k;
  s.candidates.resize(c.num_experts);
  std::iota(s.candidates.begin(), s.candidates.end(), 0);
  select_top_k(x, s.candidates, k, ids);
  // ids are in descending order, so the first selected logit is the max for the stable softmax.
  const float mx = x[ids[0]];
  float sum = 0.0f;
  for (int j = 0; j < k; ++j) sum += (w[j] = std::exp(x[ids[j]] - mx));
  for (int j = 0; j < k; ++j) w[j] /= sum;
}

}  // namespace

void llm_route(const LlmRouterConfig& config, const float* logits, const float* correction_bias,
               int64_t tokens, int32_t* ids, float* weights) {
  validate(config);
  XMOE_CHECK(tokens >= 0, "llm_route.tokens: must be >= 0, got ", tokens);
  if (tokens == 0) return;
  XMOE_CHECK(logits != nullptr, "llm_route.logits: null pointer for ", tokens, " tokens");
  XMOE_CHECK(ids != nullptr, "llm_route.ids: null pointer for ", tokens, " tokens");
  XMOE_CHECK(weights != nullptr, "llm_route.weights: null pointer for ", tokens, " tokens");

  const int E = config.num_experts, k = config.top_k;
  // Kimi K2 is DeepSeek-V3 routing with one group, whatever its config lists for n_group/topk_group.
  const bool is_kimi = config.type == LlmRouterType::kimi_k2;
  const int n_group = is_kimi ? 1 : config.n_group;
  const int topk_group = is_kimi ? 1 : config.topk_group;

  // A token's routing is a pass over its E logits (about a microsecond): a team pays only for many tokens,
  // and at decode waking it would cost more than the routing.
#pragma omp parallel if (tokens >= kTokensPerTeam)
  {
    Scratch s;
    s.score.resize(E);
    s.candidates.resize(E);
    s.group_score.resize(n_group);
    s.groups.resize(n_group);
    // Tokens are independent and each is computed wholly by one thread, so any schedule gives the same bits.
#pragma omp for schedule(static)
    for (int64_t t = 0; t < tokens; ++t) {
      const float* x = logits + t * E;
      int32_t* id = ids + t * k;
      float* w = weights + t * k;
      switch (config.type) {
        case LlmRouterType::qwen3:
          route_qwen3(config, x, s, id, w);
          break;
        case LlmRouterType::deepseek_v3:
        case LlmRouterType::kimi_k2:
          route_deepseek(config, n_group, topk_group, x, correction_bias, s, id, w);
          break;
        case LlmRouterType::gpt_oss:
          route_gpt_oss(config, x, s, id, w);
          break;
      }
    }
  }
}

}  // namespace xmoe
