// The expert-parallel layer under mpirun (np = 1, 2, 4) against the single-process layer with the same global
// weights: every rank runs the single-process layer on every rank's tokens in rank order, which is exactly
// what expert parallelism computes (routing and capacity are per rank, experts see rows in source-rank
// order).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "layer_outcome.hpp"
#include "mpi_test_main.hpp"
#include "xmoe/communicator.hpp"
#include "xmoe/moe_layer.hpp"
#include "xmoe/mpi.hpp"
#include "xmoe/reshard.hpp"
#include "xmoe/training.hpp"

namespace xmoe {
namespace {

using test::forward_backward;
using test::max_rel_diff;
using test::Outcome;
using test::random_tensor;

std::shared_ptr<Communicator> g_world;  // set once in main

struct Case {
  std::string expert = "ffn";
  int k = 2;
  double cf = 1.0;
  bool uneven = false;  // rank r has 6·r tokens (rank 0 none)
  int r = 1;
  int overlap = 1;
  DType dtype = DType::f32;
  bool grouped = false;  // grouped (dropless) execution instead of the padded buffer
};

MoeConfig config_for(const Case& c) {
  MoeConfig m;
  m.model_dim = 16;
  m.dtype = c.dtype;
  m.gate.k = c.k;
  m.gate.capacity_factor = c.cf;
  m.experts.type = c.expert;
  m.experts.num_experts = 4;
  m.experts.hidden_size = 12;
  m.experts.activation = "gelu";
  m.seed_gate = 7;
  m.seed_experts = 9;
  return m;
}

int64_t tokens_of(const Case& c, int rank) {
  return c.uneven ? 6 * rank : 32;
}

Switches switches_for(const Case& c) {
  Switches s;
  s.top_k = c.k;
  s.capacity_factor = c.cf;
  s.adaptive_r = c.r;
  s.a2a_overlap_degree = c.overlap;
  s.execution = c.grouped ? ExpertExecution::grouped : ExpertExecution::padded;
  return s;
}

Outcome run_parallel(const Case& c, MoeLayer& layer) {
  const int rank = g_world->rank();
  const int64_t T = tokens_of(c, rank);
  return forward_backward(layer, random_tensor({T, 16}, c.dtype, 100 + static_cast<uint64_t>(rank)),
                          random_tensor({T, 16}, c.dtype, 200 + static_cast<uint64_t>(rank)),
                          switches_for(c));
}

// What rank `rank` must see: the single-process layer on its own tokens, with expert gradients summed over
// every rank's tokens (run in rank order, so the sums accumulate in the same order as the expert-parallel
// run).
Outcome run_reference(const Case& c, int rank, int world) {
  // Own tokens alone: outputs and the gate's (per-rank) gradients.
  MoeLayer solo(config_for(c));
  Outcome own;
  {
    const int64_t T = tokens_of(c, rank);
    Tensor x = random_tensor({T, 16}, c.dtype, 100 + static_cast<uint64_t>(rank));
    Tensor dy = random_tensor({T, 16}, c.dtype, 200 + static_cast<uint64_t>(rank));
    solo.zero_grad();
    ForwardResult f = solo.forward(x, switches_for(c));
    own.y = f.y;
    own.aux = f.aux_loss;
    own.dx = solo.backward(dy, 0.5);
  }
  // Every rank's tokens in rank order: the expert gradients.
  MoeLayer all(config_for(c));
  all.zero_grad();
  for (int src = 0; src < world; ++src) {
    const int64_t T = tokens_of(c, src);
    Tensor x = random_tensor({T, 16}, c.dtype, 100 + static_cast<uint64_t>(src));
    Tensor dy = random_tensor({T, 16}, c.dtype, 200 + static_cast<uint64_t>(src));
    all.forward(x, switches_for(c));
    all.backward(dy, 0.5);
  }
  for (size_t i = 0; i < all.parameters().size(); ++i)
    own.grads.push_back(
        (all.parameters()[i]->is_expert ? all.parameters()[i] : solo.parameters()[i])->grad.clone());
  return own;
}

void compare(const Case& c, double exact_tol, double grad_tol) {
  const int rank = g_world->rank(), world = g_world->size();
  MoeLayer layer(config_for(c), g_world);
  Outcome got = run_parallel(c, layer);
  Outcome want = run_reference(c, rank, world);
  const std::string what = c.expert + " k=" + std::to_string(c.k) + " cf=" + std::to_string(c.cf) +
                           " r=" + std::to_string(c.r) + " D=" + std::to_string(c.overlap) +
                           (c.uneven ? " uneven" : "") + (c.grouped ? " grouped" : "") + " rank " +
                           std::to_string(rank);
  EXPECT_LE(max_rel_diff(got.y, want.y), exact_tol) << what << ": y";
  EXPECT_LE(max_rel_diff(got.dx, want.dx), exact_tol) << what << ": dx";
  EXPECT_NEAR(got.aux, want.aux, 1e-12 * std::max(1.0, std::fabs(want.aux))) << what << ": aux";
  // Expert parameters here are this rank's slice of the reference's [E, ...] tensors.
  MoeLayer full(config_for(c));
  const auto ref_params = full.parameters();
  ASSERT_EQ(layer.parameters().size(), ref_params.size());
  for (size_t i = 0; i < ref_params.size(); ++i) {
    Parameter* p = layer.parameters()[i];
    Tensor want_grad = want.grads[i];
    if (p->is_expert && world > 1) {
      const int64_t L = p->value.dim(0);
      want_grad = want_grad.slice0(rank * L, (rank + 1) * L);
      Tensor want_value = ref_params[i]->value.slice0(rank * L, (rank + 1) * L);
      EXPECT_EQ(max_rel_diff(p->value, want_value), 0.0) << what << ": initial " << p->name;
    }
    EXPECT_LE(max_rel_diff(got.grads[i], want_grad), p->is_expert ? grad_tol : exact_tol)
        << what << ": grad " << p->name;
  }
}

TEST(ExpertParallel, MatchesSingleProcessLayer) {
  for (const char* expert : {"ffn", "swiglu"})
    for (int k : {1, 2})
      for (double cf : {1.0, 0.0, -1.5}) {
        Case c;
        c.expert = expert, c.k = k, c.cf = cf;
        compare(c, 0.0, 0.0);
      }
}

TEST(ExpertParallel, UnevenAndZeroTokenCounts) {
  for (double cf : {0.0, -1.5, 1.0}) {
    Case c;
    c.uneven = true, c.cf = cf;
    if (cf > 0) {
      // Capacity comes from the group's largest token count, which the per-rank reference cannot know; check
      // that every rank agrees and nothing hangs, and that dropless-style results still hold on own tokens.
      MoeLayer layer(config_for(c), g_world);
      Outcome got = run_parallel(c, layer);
      const int64_t C = layer.last_routing().capacity;
      int64_t max_c = 0;
      g_world->all_reduce(&C, &max_c, 1, ElementType::i64, ReduceOp::max);
      EXPECT_EQ(C, max_c);
      EXPECT_EQ(got.y.dim(0), tokens_of(c, g_world->rank()));
      continue;
    }
    compare(c, 0.0, 0.0);
  }
}

TEST(ExpertParallel, DataParallelRMatches) {
  for (const char* expert : {"ffn", "swiglu"}) {
    Case c;
    c.expert = expert, c.r = 0;
    compare(c, 0.0, 1e-6);  // expert gradients: reduce-scatter sums ranks in MPI's order
  }
}

// Forward and backward both run in D chunks (the backward's dy and dx all-to-alls overlap the experts' dx
// rows; parameter gradients are summed over all rows at the end): bit-identical to D = 1.
TEST(ExpertParallel, OverlapDegreesGiveIdenticalBits) {
  for (const char* expert : {"ffn", "swiglu"})
    for (int D : {1, 2, 4})
      for (double cf : {1.0, 0.0}) {
        Case c;
        c.expert = expert, c.overlap = D, c.cf = cf;
        compare(c, 0.0, 0.0);
      }
  Case b;
  b.dtype = DType::bf16, b.overlap = 2;
  compare(b, 0.0, 0.0);
}

TEST(ExpertParallel, SwitchingEveryStepMatchesFixedConfigurations) {
  // One layer whose r, D and top_k change on every call against fresh layers fixed to each setting.
  MoeLayer switching(config_for(Case{}), g_world);
  const Case schedule[] = {
      {"ffn", 2, 1.0, false, 1, 1},  {"ffn", 1, 1.0, false, 0, 1}, {"ffn", 2, 0.0, false, 1, 4},
      {"ffn", 1, -1.5, false, 1, 2}, {"ffn", 2, 1.0, false, 0, 2},
  };
  for (const Case& c : schedule) {
    Outcome a = run_parallel(c, switching);
    MoeLayer fixed(config_for(c), g_world);
    Outcome b = run_parallel(c, fixed);
    const std::string what =
        "k=" + std::to_string(c.k) + " r=" + std::to_string(c.r) + " D=" + std::to_string(c.overlap);
    EXPECT_EQ(max_rel_diff(a.y, b.y), 0.0) << what;
    EXPECT_EQ(max_rel_diff(a.dx, b.dx), 0.0) << what;
    for (size_t i = 0; i < a.grads.size(); ++i) EXPECT_EQ(max_rel_diff(a.grads[i], b.grads[i]), 0.0) << what;
  }
}

// Adam training with the parallel gradient split equals single-process training on every rank's tokens with
// shared gradients averaged; then the trained shards, resharded to 2 ranks and to 1, give the same outputs.
TEST(ExpertParallel, TrainingAndReshardMatchSingleProcess) {
  const int rank = g_world->rank(), W = g_world->size();
  Case c;
  c.cf = 0.0;
  MoeLayer layer(config_for(c), g_world);
  MoeLayer ref(config_for(c));
  Adam opt({1e-2, 0.9, 0.999, 1e-8, 0.0}), ref_opt({1e-2, 0.9, 0.999, 1e-8, 0.0});
  for (int step = 0; step < 3; ++step) {
    run_parallel(c, layer);
    average_shared_gradients(layer, *g_world);
    opt.step(layer);
    ref.zero_grad();
    for (int src = 0; src < W; ++src) {
      Tensor x = random_tensor({tokens_of(c, src), 16}, c.dtype, 100 + static_cast<uint64_t>(src));
      Tensor dy = random_tensor({tokens_of(c, src), 16}, c.dtype, 200 + static_cast<uint64_t>(src));
      ref.forward(x, switches_for(c));
      ref.backward(dy, 0.5);
    }
    for (Parameter* p : ref.parameters())
      if (!p->is_expert)
        for (int64_t i = 0; i < p->grad.numel(); ++i) p->grad.set(i, p->grad.get(i) / W);
    ref_opt.step(ref);
  }
  for (size_t i = 0; i < ref.parameters().size(); ++i) {
    Parameter* p = layer.parameters()[i];
    Tensor want = ref.parameters()[i]->value;
    if (p->is_expert && W > 1) want = want.slice0(rank * p->value.dim(0), (rank + 1) * p->value.dim(0));
    EXPECT_LE(max_rel_diff(p->value, want), 1e-6) << "after training: " << p->name;
  }

  // Save the shards, gather on rank 0, scatter to 2.
  const std::string dir = ::testing::TempDir();
  const std::string stem = dir + "/xmoe_ep_" + std::to_string(W);
  layer.save(expand_rank_pattern(stem + "-{rank}-of-{size}.safetensors", rank, W));
  g_world->barrier();
  if (rank == 0) {
    std::vector<std::string> inputs;
    for (int r = 0; r < W; ++r)
      inputs.push_back(expand_rank_pattern(stem + "-{rank}-of-{size}.safetensors", r, W));
    reshard_gather(inputs, stem + "-merged.safetensors");
    if (W >= 2) reshard_scatter(stem + "-merged.safetensors", 2, stem + "-two-{rank}.safetensors");
  }
  g_world->barrier();
  Tensor x = random_tensor({32, 16}, c.dtype, 300 + static_cast<uint64_t>(rank));
  const Tensor y = layer.forward(x, switches_for(c)).y;
  MoeLayer single(config_for(c));
  single.load(stem + "-merged.safetensors");
  EXPECT_EQ(max_rel_diff(single.forward(x, switches_for(c)).y, y), 0.0) << "resharded to 1";
  if (W >= 2) {
    std::shared_ptr<Communicator> pair = g_world->split(rank / 2, rank);
    MoeLayer two(config_for(c), pair);
    two.load(stem + "-two-" + std::to_string(pair->rank()) + ".safetensors");
    EXPECT_EQ(max_rel_diff(two.forward(x, switches_for(c)).y, y), 0.0) << "resharded to 2";
  }
}

TEST(ExpertParallel, TwoDimensionalAllToAllEqualsFlat) {
  if (g_world->size() != 4) GTEST_SKIP() << "needs 4 ranks (2 nodes of 2)";
  Case c;
  MoeConfig flat_cfg = config_for(c), hier_cfg = config_for(c);
  hier_cfg.use_2dh = true;
  hier_cfg.local_size = 2;
  MoeLayer flat(flat_cfg, g_world), hier(hier_cfg, g_world);
  Outcome a = run_parallel(c, flat), b = run_parallel(c, hier);
  EXPECT_EQ(max_rel_diff(a.y, b.y), 0.0);
  EXPECT_EQ(max_rel_diff(a.dx, b.dx), 0.0);
  for (size_t i = 0; i < a.grads.size(); ++i) EXPECT_EQ(max_rel_diff(a.grads[i], b.grads[i]), 0.0);
}

TEST(ExpertParallel, Bf16MatchesSingleProcess) {
  Case c;
  c.dtype = DType::bf16;
  compare(c, 0.0, 0.0);
}

// Grouped execution moves exactly the kept rows (counts first, then all-to-all-v) and equals the
// single-process grouped layer bit for bit (r = 1), also with drops (cf > 0) and with ranks that have no
// tokens; r = 0 reduce-scatters the expert gradients (sums in MPI's order, so 1e-6 there).
TEST(ExpertParallel, GroupedMatchesSingleProcessGroupedLayer) {
  for (const char* expert : {"ffn", "swiglu"})
    for (int k : {1, 2})
      for (double cf : {0.0, -1.5, 1.0, 0.5}) {
        Case c;
        c.expert = expert, c.k = k, c.cf = cf, c.grouped = true;
        compare(c, 0.0, 0.0);
        c.r = 0;
        compare(c, 0.0, 1e-6);
      }
  for (double cf : {0.0, -1.5}) {
    Case c;
    c.uneven = true, c.cf = cf, c.grouped = true;
    compare(c, 0.0, 0.0);
  }
  Case d;  // the overlap degree does not change grouped results
  d.grouped = true, d.overlap = 4, d.cf = 1.0;
  compare(d, 0.0, 0.0);
  // bf16: each source rank's rows of an expert are their own weight-gradient product (AMX tiles group k in
  // steps of 32), so the sums match the reference's rank-by-rank ones bit for bit, with ragged counts too.
  for (const bool uneven : {false, true})
    for (double cf : {0.0, 1.0}) {
      if (uneven && cf > 0) continue;  // the capacity would come from the largest rank (see above)
      Case b;
      b.grouped = true, b.cf = cf, b.uneven = uneven, b.dtype = DType::bf16;
      compare(b, 0.0, 0.0);
    }
}

TEST(ExpertParallel, GroupedDropsTokensAtSmallCapacity) {
  Case c;
  c.grouped = true, c.cf = 0.5;
  MoeLayer layer(config_for(c), g_world);
  run_parallel(c, layer);
  EXPECT_GT(layer.last_routing().dropped, 0);
}

TEST(ExpertParallel, BadGroupSizeNamesTheField) {
  if (g_world->size() != 2 && g_world->size() != 4) GTEST_SKIP() << "needs 2 or 4 ranks";
  MoeConfig m = config_for(Case{});
  m.experts.num_experts = 3;
  m.gate.k = 1;
  try {
    MoeLayer layer(m, g_world);
    ADD_FAILURE() << "3 experts over " << g_world->size() << " ranks was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("experts.num_experts"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace xmoe

int main(int argc, char** argv) {
  return xmoe::testing_mpi::run_all_tests(
      argc, argv, [](std::shared_ptr<xmoe::Communicator> w) { xmoe::g_world = std::move(w); });
}
