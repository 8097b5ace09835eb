// Hidden-sharded experts (E < W, W % E == 0) under mpirun (np = 2, 4) against the single-process layer with
// the same global weights. As in test_expert_parallel.cpp, every rank also runs the single-process layer on
// every rank's tokens in rank order, which is what the expert-parallel layer computes.
//
// What is bit-identical and why: r = 1 gathers each expert's whole hidden dimension, so every row's output
// and dx are computed exactly as in the single-process layer. r > 1 (and the reduce-scattered gradients of
// every r) add partial sums over hidden slices or ranks in a different order than one GEMM does, so those are
// compared to 1e-6 relative (f32; the scale is the largest reference magnitude).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "layer_outcome.hpp"
#include "moe/experts.hpp"
#include "mpi_test_main.hpp"
#include "util/random.hpp"
#include "xmoe/communicator.hpp"
#include "xmoe/moe_layer.hpp"
#include "xmoe/reshard.hpp"
#include "xmoe/training.hpp"

namespace xmoe {
namespace {

using test::forward_backward;
using test::max_rel_diff;
using test::Outcome;
using test::random_tensor;

std::shared_ptr<Communicator> g_world;  // set once in main

constexpr int64_t kModel = 16, kHidden = 24;
constexpr double kTol = 1e-6;  // where partial sums are added in another order (see the file comment)

struct Case {
  std::string expert = "ffn";
  int experts = 1;
  int k = 1;
  double cf = 1.0;
  int r = 1;
  bool uneven = false;  // rank w has 5·w tokens (rank 0 none)
};

std::string describe(const Case& c) {
  return c.expert + " E=" + std::to_string(c.experts) + " k=" + std::to_string(c.k) +
         " cf=" + std::to_string(c.cf) + " r=" + std::to_string(c.r) + (c.uneven ? " uneven" : "") +
         " rank " + std::to_string(g_world->rank()) + " of " + std::to_string(g_world->size());
}

MoeConfig config_for(const Case& c) {
  MoeConfig m;
  m.model_dim = kModel;
  m.gate.k = c.k;
  m.gate.capacity_factor = c.cf;
  m.experts.type = c.expert;
  m.experts.num_experts = c.experts;
  m.experts.hidden_size = kHidden;
  m.experts.activation = "gelu";
  m.seed_gate = 7;
  m.seed_experts = 9;
  // The sharded layer aligns capacity to the ranks per expert (as Tutel does); give the reference the same.
  m.capacity_alignment = g_world->size() / c.experts;
  return m;
}

int64_t tokens_of(const Case& c, int rank) {
  return c.uneven ? 5 * rank : 24;
}

Switches switches_for(const Case& c) {
  Switches s;
  s.top_k = c.k;
  s.capacity_factor = c.cf;
  s.adaptive_r = c.r;
  return s;
}

Outcome step(const Case& c, MoeLayer& layer, int src, bool zero = true) {
  const int64_t T = tokens_of(c, src);
  return forward_backward(layer, random_tensor({T, kModel}, DType::f32, 100 + static_cast<uint64_t>(src)),
                          random_tensor({T, kModel}, DType::f32, 200 + static_cast<uint64_t>(src)),
                          switches_for(c), zero);
}

Tensor local_slice(const Tensor& whole, const std::string& name);
void randomize_biases(MoeLayer& layer, const MoeConfig& config, bool sharded);

// Own tokens for y, dx, aux and the gate's gradients; every rank's tokens in rank order for expert gradients.
Outcome reference(Case c) {
  c.r = 1;  // the single-process layer has no hidden split (its valid r are 0 and 1, which compute the same)
  MoeLayer solo(config_for(c));
  randomize_biases(solo, config_for(c), false);
  Outcome own = step(c, solo, g_world->rank());
  MoeLayer all(config_for(c));
  randomize_biases(all, config_for(c), false);
  all.zero_grad();
  for (int src = 0; src < g_world->size(); ++src) step(c, all, src, false);
  for (size_t i = 0; i < own.grads.size(); ++i)
    if (all.parameters()[i]->is_expert) own.grads[i] = all.parameters()[i]->grad.clone();
  return own;
}

// This rank's part of a whole-model expert tensor [E, ...]: expert rank / sc, slice rank % sc along the
// parameter's split dim.
Tensor local_slice(const Tensor& whole, const std::string& name) {
  const int W = g_world->size(), E = static_cast<int>(whole.dim(0)), sc = W / E, rank = g_world->rank();
  const int dim = moe::expert_split_dim(name);
  Tensor one = whole.slice0(rank / sc, rank / sc + 1).clone();
  int64_t outer = 1, inner = 1;
  for (int i = 1; i < dim; ++i) outer *= one.dim(i);
  for (int i = dim + 1; i < one.ndim(); ++i) inner *= one.dim(i);
  const int64_t n = one.dim(dim) / sc, j = rank % sc;
  std::vector<int64_t> dims(one.shape().dims().begin(), one.shape().dims().end());
  dims[static_cast<size_t>(dim)] = n;
  Tensor out = Tensor::empty(Shape(std::span<const int64_t>(dims)), whole.dtype());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < n * inner; ++i) out.set(o * n * inner + i, one.get((o * sc + j) * n * inner + i));
  return out;
}

// Biases start at zero; give them values (the same global ones in every layer, sharded or not) so that a
// bias counted more or less than once shows.
void randomize_biases(MoeLayer& layer, const MoeConfig& config, bool sharded) {
  MoeLayer whole(config);
  for (Parameter* p : layer.parameters()) {
    if (!p->is_expert || p->name.find("bias") == std::string::npos) continue;
    Tensor w = whole.parameter(p->name).value;
    for (int64_t i = 0; i < w.numel(); ++i) w.set(i, 0.1 * CounterRng(77).normal(static_cast<uint64_t>(i)));
    p->value.copy_from(sharded ? local_slice(w, p->name) : w);
  }
}

// The expert-sharded configurations this world size allows: E < W with W % E == 0.
std::vector<int> sharded_expert_counts() {
  std::vector<int> out;
  for (int E = 1; E < g_world->size(); ++E)
    if (g_world->size() % E == 0) out.push_back(E);
  return out;
}

std::vector<int> valid_rs(int sc) {
  std::vector<int> rs = {0};
  for (int d = 1; d <= sc; ++d)
    if (sc % d == 0) rs.push_back(d);
  return rs;
}

void compare(const Case& c) {
  MoeLayer layer(config_for(c), g_world);
  randomize_biases(layer, config_for(c), true);
  Outcome got = step(c, layer, g_world->rank());
  Outcome want = reference(c);
  const std::string what = describe(c);
  const double out_tol = c.r == 1 ? 0.0 : kTol;
  EXPECT_LE(max_rel_diff(got.y, want.y), out_tol) << what << ": y";
  EXPECT_LE(max_rel_diff(got.dx, want.dx), out_tol) << what << ": dx";
  EXPECT_NEAR(got.aux, want.aux, 1e-12 * std::max(1.0, std::fabs(want.aux))) << what << ": aux";
  MoeLayer whole(config_for(c));
  ASSERT_EQ(layer.parameters().size(), whole.parameters().size());
  for (size_t i = 0; i < got.grads.size(); ++i) {
    Parameter* p = layer.parameters()[i];
    if (!p->is_expert) {
      // The gate's gradient goes through ⟨dy, expert output⟩, so it is exact exactly when the outputs are.
      EXPECT_LE(max_rel_diff(got.grads[i], want.grads[i]), out_tol) << what << ": grad " << p->name;
      continue;
    }
    if (p->name.find("bias") == std::string::npos) {
      EXPECT_EQ(max_rel_diff(p->value, local_slice(whole.parameters()[i]->value, p->name)), 0.0)
          << what << ": initial " << p->name;
    }
    EXPECT_LE(max_rel_diff(got.grads[i], local_slice(want.grads[i], p->name)), kTol)
        << what << ": grad " << p->name;
  }
}

TEST(ShardedExperts, EveryValidRMatchesSingleProcessLayer) {
  for (int E : sharded_expert_counts())
    for (const char* expert : {"ffn", "swiglu"})
      for (int r : valid_rs(g_world->size() / E))
        for (double cf : {1.0, 0.0, -1.5}) {
          Case c;
          c.expert = expert, c.experts = E, c.r = r, c.cf = cf, c.k = E > 1 ? 2 : 1;
          compare(c);
        }
}

TEST(ShardedExperts, UnevenAndZeroTokenCounts) {
  for (int E : sharded_expert_counts())
    for (int r : valid_rs(g_world->size() / E))
      for (double cf : {0.0, -1.5}) {
        Case c;
        c.experts = E, c.r = r, c.cf = cf, c.uneven = true;
        compare(c);
      }
}

TEST(ShardedExperts, DropsAtCapacityFactorBelowOne) {
  for (int E : sharded_expert_counts()) {
    Case c;
    c.experts = E, c.cf = 0.5, c.r = g_world->size() / E;
    compare(c);
    MoeLayer layer(config_for(c), g_world);
    layer.forward(random_tensor({tokens_of(c, g_world->rank()), kModel}, DType::f32, 5), switches_for(c));
    EXPECT_GT(layer.last_routing().dropped, 0) << describe(c) << ": the case should drop tokens";
  }
}

// Sharded experts in D chunks (forward and backward) against D = 1: bit-identical. Capacity is aligned to
// sc·D as in Tutel, so compare at cf = 0, where the alignment only adds padding rows (zeros).
TEST(ShardedExperts, OverlapDegreeGivesIdenticalBits) {
  for (int E : sharded_expert_counts())
    for (int r : valid_rs(g_world->size() / E)) {
      Case c;
      c.experts = E, c.r = r, c.cf = 0.0, c.expert = "swiglu";
      MoeLayer one(config_for(c), g_world), two(config_for(c), g_world);
      Outcome a = step(c, one, g_world->rank());
      Switches sw = switches_for(c);
      sw.a2a_overlap_degree = 2;
      Tensor x = random_tensor({tokens_of(c, g_world->rank()), kModel}, DType::f32,
                               100 + static_cast<uint64_t>(g_world->rank()));
      Tensor dy = random_tensor({tokens_of(c, g_world->rank()), kModel}, DType::f32,
                                200 + static_cast<uint64_t>(g_world->rank()));
      two.zero_grad();
      const Tensor y = two.forward(x, sw).y;
      const Tensor dx = two.backward(dy, 0.5);
      EXPECT_EQ(max_rel_diff(y, a.y), 0.0) << describe(c);
      EXPECT_EQ(max_rel_diff(dx, a.dx), 0.0) << describe(c);
      for (size_t i = 0; i < a.grads.size(); ++i)
        EXPECT_EQ(max_rel_diff(two.parameters()[i]->grad, a.grads[i]), 0.0) << describe(c) << " grad " << i;
    }
}

// One layer trained with SGD while r changes on every step, against one trained at fixed r = 1.
TEST(ShardedExperts, SwitchingREveryStepMatchesFixedR) {
  for (int E : sharded_expert_counts()) {
    const std::vector<int> rs = valid_rs(g_world->size() / E);
    Case fixed_case;
    fixed_case.experts = E, fixed_case.cf = 0.0, fixed_case.expert = "swiglu";
    MoeLayer switching(config_for(fixed_case), g_world), fixed(config_for(fixed_case), g_world);
    Sgd sgd_a({0.05, 0.0, 0.0}), sgd_b({0.05, 0.0, 0.0});
    for (size_t s = 0; s < 2 * rs.size(); ++s) {
      Case c = fixed_case;
      c.r = rs[(s * 3 + 1) % rs.size()];
      Outcome a = step(c, switching, g_world->rank());
      Outcome b = step(fixed_case, fixed, g_world->rank());
      const std::string what = describe(c) + " step " + std::to_string(s);
      EXPECT_LE(max_rel_diff(a.y, b.y), kTol) << what << ": y";
      EXPECT_LE(max_rel_diff(a.dx, b.dx), kTol) << what << ": dx";
      for (size_t i = 0; i < a.grads.size(); ++i)
        EXPECT_LE(max_rel_diff(a.grads[i], b.grads[i]), kTol) << what << ": grad " << i;
      average_shared_gradients(switching, *g_world);
      average_shared_gradients(fixed, *g_world);
      sgd_a.step(switching);
      sgd_b.step(fixed);
    }
    for (size_t i = 0; i < fixed.parameters().size(); ++i)
      EXPECT_LE(max_rel_diff(switching.parameters()[i]->value, fixed.parameters()[i]->value), kTol)
          << "after training: " << fixed.parameters()[i]->name;
  }
}

// A sharded layer trained a little, saved per rank, gathered to one file and scattered to 2 ranks: the same
// outputs everywhere (r = 1 computes exactly the single-process rows).
TEST(ShardedExperts, CheckpointReshardKeepsOutputs) {
  const int rank = g_world->rank(), W = g_world->size();
  for (int E : sharded_expert_counts())
    for (const char* expert : {"ffn", "swiglu"}) {
      Case c;
      c.experts = E, c.expert = expert, c.cf = 0.0, c.r = 1;
      MoeLayer layer(config_for(c), g_world);
      Sgd sgd({0.1, 0.0, 0.0});
      for (int s = 0; s < 2; ++s) {
        step(c, layer, rank);
        average_shared_gradients(layer, *g_world);
        sgd.step(layer);
      }
      const std::string stem = ::testing::TempDir() + "/xmoe_sharded_" + expert + "_E" + std::to_string(E) +
                               "_W" + std::to_string(W);
      layer.save(expand_rank_pattern(stem + "-{rank}-of-{size}.safetensors", rank, W));
      g_world->barrier();
      if (rank == 0) {
        std::vector<std::string> inputs;
        for (int w = 0; w < W; ++w)
          inputs.push_back(expand_rank_pattern(stem + "-{rank}-of-{size}.safetensors", w, W));
        reshard_gather(inputs, stem + "-merged.safetensors");
        reshard_scatter(stem + "-merged.safetensors", 2, stem + "-two-{rank}.safetensors");
        // Scatter back to W and gather again: the same bytes as the first gather.
        reshard_scatter(stem + "-merged.safetensors", W, stem + "-again-{rank}.safetensors");
        std::vector<std::string> again;
        for (int w = 0; w < W; ++w)
          again.push_back(expand_rank_pattern(stem + "-again-{rank}.safetensors", w, W));
        reshard_gather(again, stem + "-merged2.safetensors");
        MoeLayer a(config_for(c)), b(config_for(c));
        a.load(stem + "-merged.safetensors");
        b.load(stem + "-merged2.safetensors");
        for (size_t i = 0; i < a.parameters().size(); ++i)
          EXPECT_EQ(max_rel_diff(a.parameters()[i]->value, b.parameters()[i]->value), 0.0)
              << describe(c) << ": scatter + gather changed " << a.parameters()[i]->name;
      }
      g_world->barrier();
      Tensor x = random_tensor({20, kModel}, DType::f32, 300 + static_cast<uint64_t>(rank));
      const Tensor y = layer.forward(x, switches_for(c)).y;
      MoeLayer single(config_for(c));
      single.load(stem + "-merged.safetensors");
      EXPECT_EQ(max_rel_diff(single.forward(x, switches_for(c)).y, y), 0.0)
          << describe(c) << ": resharded to 1";
      for (Parameter* p : layer.parameters()) {
        if (!p->is_expert) continue;
        EXPECT_EQ(max_rel_diff(p->value, local_slice(single.parameter(p->name).value, p->name)), 0.0)
            << describe(c) << ": merged " << p->name;
      }
      if (W > 2 && 2 % E == 0) {
        std::shared_ptr<Communicator> pair = g_world->split(rank / 2, rank);
        MoeLayer two(config_for(c), pair);
        two.load(stem + "-two-" + std::to_string(pair->rank()) + ".safetensors");
        EXPECT_EQ(max_rel_diff(two.forward(x, switches_for(c)).y, y), 0.0)
            << describe(c) << ": resharded to 2";
      }
    }
}

TEST(ShardedExperts, InvalidRAndSplitsNameTheField) {
  const int W = g_world->size();
  if (W < 2) GTEST_SKIP() << "needs 2 or more ranks";
  auto expect_error = [](const std::function<void()>& fn, const std::string& field) {
    try {
      fn();
      ADD_FAILURE() << "accepted; expected an error naming " << field;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  Case c;
  MoeLayer layer(config_for(c), g_world);  // E = 1: sc = W
  Switches bad = switches_for(c);
  bad.adaptive_r = W + 1;
  Tensor x = random_tensor({8, kModel}, DType::f32, 1);
  expect_error([&] { layer.forward(x, bad); }, "adaptive_r");
  if (W == 4) {
    bad.adaptive_r = 3;
    expect_error([&] { layer.forward(x, bad); }, "adaptive_r");
  }
  Switches grouped = switches_for(c);
  grouped.execution = ExpertExecution::grouped;
  expect_error([&] { layer.forward(x, grouped); }, "execution");
  MoeConfig odd_hidden = config_for(c);
  odd_hidden.experts.hidden_size = 2 * W + 1;
  expect_error([&] { MoeLayer l(odd_hidden, g_world); }, "experts.hidden_size");
  if (W == 4) {
    MoeConfig three = config_for(c);
    three.experts.num_experts = 3;
    expect_error([&] { MoeLayer l(three, g_world); }, "experts.num_experts");
  }
}

}  // namespace
}  // namespace xmoe

int main(int argc, char** argv) {
  return xmoe::testing_mpi::run_all_tests(
      argc, argv, [](std::shared_ptr<xmoe::Communicator> w) { xmoe::g_world = std::move(w); });
}
