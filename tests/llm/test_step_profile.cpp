// The step profile (llm/step_profile.hpp, `xmoe generate --profile`) on a tiny Qwen3-MoE (tests/data/models,
// transformers' fixtures): turning it on changes no generated token; its ops partition each step's time; the
// bytes and flops it reports follow from the checkpoint's shapes, computed here independently.
#include <gtest/gtest.h>

#include <vector>

#include "llm/engine.hpp"
#include "llm/model_oracle.hpp"
#include "llm/step_profile.hpp"

namespace xmoe::llm {
namespace {

using namespace test;

std::vector<GenerationResult> generate(CausalLM& model, StepProfile* profile, EngineStats* stats) {
  EngineOptions o;
  o.kv_block_size = 4;
  o.kv_cache_bytes = size_t{1} << 20;
  o.profile = profile;
  Engine engine(model, o);
  std::vector<RequestId> ids;
  for (int i = 0; i < 3; ++i) {
    GenerationRequest r;
    for (int t = 0; t < 5 + i; ++t) r.prompt.push_back((t * 37 + i * 11 + 3) % 256);
    r.max_tokens = 6;
    r.ignore_eos = true;
    r.sampling.temperature = i == 0 ? 0.0 : 0.8;
    r.sampling.top_k = i == 2 ? 20 : 0;
    r.sampling.seed = 40 + static_cast<uint64_t>(i);
    ids.push_back(engine.submit(std::move(r)));
  }
  engine.run_until_idle();
  std::vector<GenerationResult> out;
  for (RequestId id : ids) out.push_back(engine.take_result(id));
  if (stats) *stats = engine.stats();
  return out;
}

TEST(StepProfile, ChangesNoTokenAndPartitionsEachStep) {
  Loaded l = load("tied-sparse", DType::bf16);
  CausalLM& m = *l.model;
  StepProfile profile;
  EngineStats stats;
  const std::vector<GenerationResult> plain = generate(m, nullptr, nullptr);
  const std::vector<GenerationResult> timed = generate(m, &profile, &stats);
  ASSERT_EQ(plain.size(), timed.size());
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_EQ(plain[i].token_ids, timed[i].token_ids) << i;

  const StepProfile::PhaseTotals& prefill = profile.phase(StepProfile::Phase::prefill);
  const StepProfile::PhaseTotals& decode = profile.phase(StepProfile::Phase::decode);
  EXPECT_EQ(prefill.steps, stats.prefill_steps);
  EXPECT_EQ(decode.steps, stats.decode_steps);
  EXPECT_EQ(decode.tokens, stats.decode_tokens);
  ASSERT_GT(decode.steps, 0);
  for (const StepProfile::PhaseTotals* p : {&prefill, &decode}) {
    double sum = 0;
    for (const ProfileTotals& t : p->ops) {
      EXPECT_GE(t.wall, 0.0);
      sum += t.wall;
    }
    // The engine's scope lies inside the step's interval and its nested scopes split it.
    EXPECT_LE(sum, p->wall * (1 + 1e-9));
    EXPECT_GE(sum, 0.5 * p->wall);
  }

  // tied-sparse: 3 layers (sparse, dense, sparse), hidden 64, 4 heads / 2 kv heads of 16, 8 experts, k 2,
  // expert FFN 16, dense FFN 48, vocab 256, bf16.
  const double H = 64, D = 16, V = 256, steps = static_cast<double>(decode.steps);
  const double tokens = static_cast<double>(decode.tokens);
  const auto& op = [&](ProfileOp o) { return decode.ops[static_cast<size_t>(o)]; };
  EXPECT_DOUBLE_EQ(op(ProfileOp::lm_head).bytes, steps * V * H * 2);
  EXPECT_DOUBLE_EQ(op(ProfileOp::lm_head).flops, tokens * 2 * V * H);
  EXPECT_DOUBLE_EQ(op(ProfileOp::embedding).bytes, tokens * H * 2);
  const double qkv = (4 * D + 2 * 2 * D) * H, o_proj = H * 4 * D;
  EXPECT_DOUBLE_EQ(op(ProfileOp::attention_proj).bytes, 3 * steps * (qkv + o_proj) * 2);
  EXPECT_DOUBLE_EQ(op(ProfileOp::attention_proj).flops, 3 * tokens * 2 * (qkv + o_proj));
  EXPECT_EQ(op(ProfileOp::router).calls, 2 * decode.steps);
  EXPECT_DOUBLE_EQ(op(ProfileOp::router).flops, 2 * tokens * 2 * 8 * H);
  // Routed experts (2 sparse layers, k = 2) and the dense layer's MLP.
  EXPECT_DOUBLE_EQ(op(ProfileOp::experts).flops, 2 * tokens * 2 * 6 * 16 * H + tokens * 6 * 48 * H);
  EXPECT_GT(op(ProfileOp::sampler).calls, 0);
  EXPECT_GT(op(ProfileOp::engine).calls, 0);

  const std::string report = profile.report(2, 1.5);
  EXPECT_NE(report.find("profile prefill:"), std::string::npos);
  EXPECT_NE(report.find("profile decode:"), std::string::npos);
  for (const char* name : kProfileOpNames) EXPECT_NE(report.find(name), std::string::npos) << name;
  EXPECT_EQ(report.find("bound"), std::string::npos);  // no limits, no bound

  // The step bound: each op at the larger of its bytes at the read bandwidth and its flops at the peak.
  // With a peak so high that no op's flops matter it is the step's bytes at the bandwidth; with a bandwidth
  // so high that no op's bytes matter, its flops at the peak.
  double bytes = 0, flops = 0;
  for (const ProfileTotals& t : decode.ops) bytes += t.bytes, flops += t.flops;
  const auto decode_bound = [&](double gbs, double gflops) {
    return profile.bound(StepProfile::Phase::decode, ProfileLimits{gbs, gflops, "FMA"});
  };
  EXPECT_NEAR(decode_bound(2, 1e12).bound, bytes / steps / 2e9, 1e-12 * bytes / steps);
  EXPECT_NEAR(decode_bound(2, 1e12).bytes_only, bytes / steps / 2e9, 1e-12 * bytes / steps);
  EXPECT_NEAR(decode_bound(1e12, 3).bound, flops / steps / 3e9, 1e-12 * flops / steps);
  // In between, each op takes its own larger side: the bound lies between the larger of the two totals and
  // their sum, and one op's bound is its bytes or its flops as the limits make it.
  const StepProfile::StepBound mixed = decode_bound(1, 1);
  EXPECT_GE(mixed.bound, std::max(bytes, flops) / steps / 1e9 * (1 - 1e-12));
  EXPECT_LE(mixed.bound, (bytes + flops) / steps / 1e9 * (1 + 1e-12));
  const double lm_bytes = op(ProfileOp::lm_head).bytes / steps,
               lm_flops = op(ProfileOp::lm_head).flops / steps;
  EXPECT_DOUBLE_EQ(StepProfile::op_bound(op(ProfileOp::lm_head), decode.steps, ProfileLimits{1, 1e9, "FMA"}),
                   lm_bytes / 1e9);
  EXPECT_DOUBLE_EQ(StepProfile::op_bound(op(ProfileOp::lm_head), decode.steps, ProfileLimits{1e9, 1, "FMA"}),
                   lm_flops / 1e9);
  const std::string bounded = profile.report(2, 1.5, ProfileLimits{30, 200, "VDPBF16PS"});
  EXPECT_NE(bounded.find("bound ms/st"), std::string::npos);
  EXPECT_NE(bounded.find("its flops at the VDPBF16PS peak 200.0 GFLOP/s"), std::string::npos);
}

}  // namespace
}  // namespace xmoe::llm
