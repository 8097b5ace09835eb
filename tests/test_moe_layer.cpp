// Behaviour of the MoE layer that the PyTorch oracle fixtures do not cover: per-call switching, thread-count
// determinism, grouped vs padded execution, finite differences in f64, custom experts, bad input, save/load.
#include <gtest/gtest.h>
#include <omp.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <string>

#include "moe/experts.hpp"
#include "util/random.hpp"
#include "xmoe/moe_layer.hpp"

namespace xmoe {
namespace {

MoeConfig small_config(DType dtype = DType::f32) {
  MoeConfig c;
  c.model_dim = 12;
  c.dtype = dtype;
  c.gate.k = 2;
  c.gate.capacity_factor = 1.0;
  c.experts.num_experts = 4;
  c.experts.hidden_size = 10;
  c.experts.activation = "gelu";
  c.seed_gate = 3;
  c.seed_experts = 5;
  return c;
}

Tensor random_tensor(const Shape& s, DType dtype, uint64_t seed, double scale = 1.0) {
  Tensor t = Tensor::empty(s, dtype);
  CounterRng rng(seed);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, scale * rng.normal(static_cast<uint64_t>(i)));
  return t;
}

Switches make_switches(int k, double cf, ExpertExecution execution = ExpertExecution::padded) {
  Switches s;
  s.top_k = k;
  s.capacity_factor = cf;
  s.execution = execution;
  return s;
}

Switches top_k_only(int k) {
  Switches s;
  s.top_k = k;
  return s;
}

bool bit_equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

struct RunResult {
  Tensor y, dx;
  double aux = 0;
  std::vector<Tensor> grads;
};

RunResult run(MoeLayer& layer, const Tensor& x, const Tensor& dy, const Switches& sw, double daux = 0.3) {
  layer.zero_grad();
  RunResult r;
  ForwardResult f = layer.forward(x, sw);
  r.y = f.y;
  r.aux = f.aux_loss;
  r.dx = layer.backward(dy, daux);
  for (Parameter* p : layer.parameters()) r.grads.push_back(p->grad.clone());
  return r;
}

void expect_same_bits(const RunResult& a, const RunResult& b, const std::string& what) {
  EXPECT_TRUE(bit_equal(a.y, b.y)) << what << ": y";
  EXPECT_TRUE(bit_equal(a.dx, b.dx)) << what << ": dx";
  EXPECT_EQ(a.aux, b.aux) << what << ": aux";
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (size_t i = 0; i < a.grads.size(); ++i)
    EXPECT_TRUE(bit_equal(a.grads[i], b.grads[i])) << what << ": grad " << i;
}

TEST(MoeLayer, SwitchingTopKAndCapacityMatchesFreshLayers) {
  const MoeConfig base = small_config();
  const int64_t T = 40;
  Tensor x = random_tensor({T, base.model_dim}, DType::f32, 11);
  Tensor dy = random_tensor({T, base.model_dim}, DType::f32, 12);
  MoeLayer switching(base);
  const std::vector<std::pair<int, double>> schedule = {{2, 1.0},  {1, 0.0}, {4, -0.5}, {2, 0.5},
                                                        {1, 1.25}, {3, 0.0}, {2, -2.0}, {2, 1.0}};
  for (auto [k, cf] : schedule) {
    Switches sw;
    sw.top_k = k;
    sw.capacity_factor = cf;
    RunResult got = run(switching, x, dy, sw);
    MoeConfig fresh_cfg = base;
    fresh_cfg.gate.k = k;
    fresh_cfg.gate.capacity_factor = cf;
    MoeLayer fresh(fresh_cfg);
    RunResult want = run(fresh, x, dy, Switches{});
    expect_same_bits(got, want, "k=" + std::to_string(k) + " cf=" + std::to_string(cf));
  }
}

TEST(MoeLayer, NoWorkspaceGrowthAfterWarmupWhenSwitching) {
  MoeLayer layer(small_config());
  const int64_t T = 64;
  Tensor x = random_tensor({T, 12}, DType::f32, 1);
  Tensor dy = random_tensor({T, 12}, DType::f32, 2);
  const std::vector<std::pair<int, double>> schedule = {{4, 0.0}, {1, 1.0}, {2, -1.0}, {3, 2.0}};
  for (auto [k, cf] : schedule) run(layer, x, dy, make_switches(k, cf));  // warm-up over every configuration
  const size_t warm = layer.workspace_bytes();
  for (int rep = 0; rep < 3; ++rep)
    for (auto [k, cf] : schedule) {
      Switches sw = make_switches(k, cf);
      sw.execution = rep % 2 ? ExpertExecution::grouped : ExpertExecution::padded;
      run(layer, x, dy, sw);
      EXPECT_EQ(layer.workspace_bytes(), warm) << "k=" << k << " cf=" << cf;
    }
}

TEST(MoeLayer, ThreadCountDoesNotChangeBits) {
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (const char* expert : {"ffn", "swiglu"}) {
      MoeConfig c = small_config(dtype);
      c.model_dim = 64;
      c.experts.hidden_size = 48;
      c.experts.type = expert;
      c.gate.type = std::string(expert) == "ffn" ? "top" : "cosine_top";
      c.gate.proj_dim = 16;
      const int64_t T = 301;
      Tensor x = random_tensor({T, c.model_dim}, dtype, 21);
      Tensor dy = random_tensor({T, c.model_dim}, dtype, 22);
      const int saved = omp_get_max_threads();
      omp_set_num_threads(1);
      MoeLayer one(c);
      RunResult a = run(one, x, dy, Switches{});
      omp_set_num_threads(2);
      MoeLayer two(c);
      RunResult b = run(two, x, dy, Switches{});
      omp_set_num_threads(saved);
      expect_same_bits(a, b, std::string(dtype_name(dtype)) + " " + expert);
    }
  }
}

TEST(MoeLayer, GroupedEqualsPaddedBitForBit) {
  for (double cf : {0.0, -0.5, 1.0, 0.5}) {
    for (bool post : {true, false}) {
      for (const char* expert : {"ffn", "swiglu"}) {
        MoeConfig c = small_config();
        c.is_postscore = post;
        c.experts.type = expert;
        c.gate.capacity_factor = cf;
        const int64_t T = 50;
        Tensor x = random_tensor({T, c.model_dim}, DType::f32, 31);
        Tensor dy = random_tensor({T, c.model_dim}, DType::f32, 32);
        MoeLayer layer(c);
        RunResult padded = run(layer, x, dy, Switches{});
        const int64_t padded_capacity = layer.last_routing().capacity;
        Switches g;
        g.execution = ExpertExecution::grouped;
        RunResult grouped = run(layer, x, dy, g);
        EXPECT_EQ(layer.last_routing().capacity, padded_capacity);
        expect_same_bits(padded, grouped,
                         std::string(expert) + " cf=" + std::to_string(cf) + " post=" + std::to_string(post));
      }
    }
  }
}

TEST(MoeLayer, DropsHappenAndDroppedTokensContributeZero) {
  MoeConfig c = small_config();
  c.gate.k = 1;
  c.gate.capacity_factor = 0.25;  // C = 1·int(0.25·ceil(40/4)) = 2 per expert
  MoeLayer layer(c);
  const int64_t T = 40;
  Tensor x = random_tensor({T, c.model_dim}, DType::f32, 41);
  ForwardResult r = layer.forward(x);
  const RoutingSummary& s = layer.last_routing();
  EXPECT_EQ(s.capacity, 2);
  EXPECT_GT(s.dropped, 0);
  int64_t zero_rows = 0;
  for (int64_t t = 0; t < T; ++t) {
    const bool dropped = s.locations[static_cast<size_t>(t)] >= s.capacity;
    bool all_zero = true;
    for (int64_t m = 0; m < c.model_dim; ++m) all_zero = all_zero && r.y.get(t * c.model_dim + m) == 0.0;
    EXPECT_EQ(dropped, all_zero) << "token " << t;
    zero_rows += all_zero;
  }
  EXPECT_EQ(zero_rows, s.dropped);
}

// Central differences of L = Σ y·dy + daux·aux in f64 against backward, on every parameter and x.
void check_finite_differences(MoeConfig c, const Switches& sw, const std::string& what) {
  c.dtype = DType::f64;
  MoeLayer layer(c);
  const int64_t T = 14;
  Tensor x = random_tensor({T, c.model_dim}, DType::f64, 51);
  Tensor dy = random_tensor({T, layer.output_dim()}, DType::f64, 52);
  Tensor noise = random_tensor({T, c.experts.num_experts}, DType::f64, 53);
  Switches s = sw;
  s.noise = &noise;
  const double daux = 0.7;
  auto objective = [&]() {
    ForwardResult f = layer.forward(x, s);
    double l = daux * f.aux_loss;
    for (int64_t i = 0; i < f.y.numel(); ++i) l += f.y.get(i) * dy.get(i);
    return l;
  };
  layer.zero_grad();
  objective();
  const std::vector<int32_t> ids = layer.last_routing().expert_ids;
  Tensor dx = layer.backward(dy, daux);
  auto check = [&](Tensor& value, const Tensor& grad, const std::string& name) {
    const int64_t n = value.numel();
    const int64_t stride = std::max<int64_t>(1, n / 40);
    for (int64_t i = 0; i < n; i += stride) {
      const double h = 1e-6, v = value.get(i);
      value.set(i, v + h);
      const double lp = objective();
      const bool same_routing = layer.last_routing().expert_ids == ids;
      value.set(i, v - h);
      const double lm = objective();
      value.set(i, v);
      if (!same_routing || layer.last_routing().expert_ids != ids)
        continue;  // a selection flipped: not smooth
      const double fd = (lp - lm) / (2 * h), an = grad.get(i);
      EXPECT_NEAR(an, fd, 1e-6 * std::max(1.0, std::fabs(fd))) << what << ": " << name << "[" << i << "]";
    }
  };
  check(x, dx, "x");
  for (Parameter* p : layer.parameters()) check(p->value, p->grad, p->name);
}

TEST(MoeLayer, FiniteDifferencesF64) {
  struct Case {
    std::string name;
    std::function<void(MoeConfig&)> edit;
    Switches sw;
  };
  std::vector<Case> cases = {
      {"top ffn gelu postscore k2 cf1", [](MoeConfig&) {}, {}},
      {"top ffn relu not-postscore",
       [](MoeConfig& c) { c.is_postscore = false, c.experts.activation = "relu"; },
       {}},
      {"top ffn silu no-normalize",
       [](MoeConfig& c) { c.normalize_gate = false, c.experts.activation = "silu"; },
       {}},
      {"top ffn no biases output_dim 7",
       [](MoeConfig& c) {
         c.experts.has_fc1_bias = c.experts.has_fc2_bias = false, c.experts.output_dim = 7;
       },
       {}},
      {"top swiglu dropless", [](MoeConfig& c) { c.experts.type = "swiglu"; }, make_switches(0, 0.0)},
      {"cosine ffn k1", [](MoeConfig& c) { c.gate.type = "cosine_top", c.gate.proj_dim = 6; }, top_k_only(1)},
      {"cosine swiglu not-postscore k4",
       [](MoeConfig& c) {
         c.gate.type = "cosine_top", c.gate.proj_dim = 6, c.experts.type = "swiglu", c.is_postscore = false;
       },
       top_k_only(4)},
      {"gshard with noise", [](MoeConfig& c) { c.gate.gate_noise = 1.0; }, {}},
      {"importance+load loss", [](MoeConfig& c) { c.gate.gate_noise = 1.0, c.is_gshard_loss = false; }, {}},
      {"bpr capped dropless grouped", [](MoeConfig& c) { c.batch_prioritized_routing = true; },
       make_switches(2, -0.5, ExpertExecution::grouped)},
      {"drops cf 0.5", [](MoeConfig&) {}, make_switches(2, 0.5)},
  };
  for (auto& tc : cases) {
    MoeConfig c = small_config(DType::f64);
    c.model_dim = 6;
    c.experts.hidden_size = 5;
    tc.edit(c);
    check_finite_differences(c, tc.sw, tc.name);
  }
}

// A custom expert: y = x ⊙ scale[e] (one learnable vector per expert).
class ScaleExpert final : public CustomExpert {
 public:
  ScaleExpert(int experts, int64_t dim) : experts_(experts), dim_(dim) {
    p_.name = "experts.scale";
    p_.value = random_tensor({experts, dim}, DType::f64, 99);
    p_.grad = Tensor::zeros({experts, dim}, DType::f64);
  }
  void forward(const Tensor& x, std::span<const int64_t> off, Tensor& y) override {
    x_ = x;
    for (int e = 0; e < experts_; ++e)
      for (int64_t r = off[static_cast<size_t>(e)]; r < off[static_cast<size_t>(e) + 1]; ++r)
        for (int64_t m = 0; m < dim_; ++m)
          y.set(r * dim_ + m, x.get(r * dim_ + m) * p_.value.get(e * dim_ + m));
  }
  void backward(const Tensor& dy, std::span<const int64_t> off, Tensor& dx) override {
    for (int e = 0; e < experts_; ++e)
      for (int64_t r = off[static_cast<size_t>(e)]; r < off[static_cast<size_t>(e) + 1]; ++r)
        for (int64_t m = 0; m < dim_; ++m) {
          const double d = dy.get(r * dim_ + m);
          dx.set(r * dim_ + m, d * p_.value.get(e * dim_ + m));
          p_.grad.set(e * dim_ + m, p_.grad.get(e * dim_ + m) + d * x_.get(r * dim_ + m));
        }
  }
  std::vector<Parameter*> parameters() override { return {&p_}; }

 private:
  int experts_;
  int64_t dim_;
  Parameter p_;
  Tensor x_;
};

TEST(MoeLayer, CustomExpertForwardAndGradients) {
  MoeConfig c = small_config(DType::f64);
  c.model_dim = 6;
  c.experts.type = "custom";
  c.experts.custom = std::make_shared<ScaleExpert>(4, 6);
  {
    MoeLayer layer(c);
    const int64_t T = 9;
    Tensor x = random_tensor({T, 6}, DType::f64, 7);
    ForwardResult r = layer.forward(x, make_switches(2, 0.0));
    const RoutingSummary& s = layer.last_routing();
    const Tensor& scale = layer.parameter("experts.scale").value;
    Tensor wg = layer.parameter("gate.wg").value;
    for (int64_t t = 0; t < T; ++t) {
      // Recompute the softmax gate weights of this token's two choices, normalised.
      std::vector<double> logit(4);
      double mx = -1e300, z = 0;
      for (int e = 0; e < 4; ++e) {
        for (int64_t m = 0; m < 6; ++m) logit[e] += x.get(t * 6 + m) * wg.get(e * 6 + m);
        mx = std::max(mx, logit[e]);
      }
      for (int e = 0; e < 4; ++e) z += std::exp(logit[e] - mx);
      const int e0 = s.expert_ids[static_cast<size_t>(t)], e1 = s.expert_ids[static_cast<size_t>(T + t)];
      const double g0 = std::exp(logit[e0] - mx) / z, g1 = std::exp(logit[e1] - mx) / z;
      for (int64_t m = 0; m < 6; ++m) {
        const double want =
            (g0 * scale.get(e0 * 6 + m) + g1 * scale.get(e1 * 6 + m)) * x.get(t * 6 + m) / (g0 + g1);
        EXPECT_NEAR(r.y.get(t * 6 + m), want, 1e-12);
      }
    }
  }
  check_finite_differences(c, make_switches(2, 0.0), "custom expert");
}

template <class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(MoeLayer, BadConfigurationNamesTheField) {
  auto with = [](std::function<void(MoeConfig&)> edit) {
    MoeConfig c = small_config();
    edit(c);
    return error_of([&] { MoeLayer layer(c); });
  };
  EXPECT_NE(with([](MoeConfig& c) { c.gate.k = 5; }).find("gate.k"), std::string::npos);
  EXPECT_NE(with([](MoeConfig& c) { c.gate.k = 0; }).find("gate.k"), std::string::npos);
  EXPECT_NE(with([](MoeConfig& c) { c.model_dim = 0; }).find("model_dim"), std::string::npos);
  EXPECT_NE(with([](MoeConfig& c) { c.experts.hidden_size = -3; }).find("experts.hidden_size"),
            std::string::npos);
  EXPECT_NE(with([](MoeConfig& c) { c.experts.num_experts = 0; }).find("experts.num_experts"),
            std::string::npos);
  EXPECT_NE(with([](MoeConfig& c) { c.gate.type = "bogus"; }).find("gate.type"), std::string::npos);
  EXPECT_NE(with([](MoeConfig& c) { c.experts.type = "bogus"; }).find("experts.type"), std::string::npos);
  EXPECT_NE(with([](MoeConfig& c) { c.experts.activation = "tanhh"; }).find("experts.activation"),
            std::string::npos);
  EXPECT_NE(with([](MoeConfig& c) { c.is_gshard_loss = false; }).find("gate_noise"), std::string::npos);
  EXPECT_NE(with([](MoeConfig& c) { c.experts.type = "custom"; }).find("experts.custom"), std::string::npos);
}

// The weight gradients' segments: each expert's rows cut at the cuts strictly inside them, in buffer order;
// empty experts, cuts on an expert's edges and repeated cuts give no empty pieces.
TEST(MoeLayer, WeightGradientSegmentsFollowTheCuts) {
  using Piece = std::array<int64_t, 3>;
  auto pieces = [](std::vector<int64_t> offsets, std::vector<int64_t> cuts) {
    std::vector<Piece> got;
    moe::for_each_segment(offsets, cuts, [&](int64_t e, int64_t r0, int64_t r1) {
      got.push_back({e, r0, r1});
    });
    return got;
  };
  EXPECT_EQ(pieces({0, 3, 3, 7}, {}), (std::vector<Piece>{{0, 0, 3}, {2, 3, 7}}));
  EXPECT_EQ(pieces({0, 4, 8}, {2, 4, 4, 5, 8}),
            (std::vector<Piece>{{0, 0, 2}, {0, 2, 4}, {1, 4, 5}, {1, 5, 8}}));
  EXPECT_EQ(pieces({0, 6, 6, 12}, {0, 3, 6, 9, 12}),
            (std::vector<Piece>{{0, 0, 3}, {0, 3, 6}, {2, 6, 9}, {2, 9, 12}}));
  EXPECT_EQ(pieces({5, 5}, {5}), std::vector<Piece>{});
}

TEST(MoeLayer, BadCallArgumentsNameTheArgument) {
  MoeLayer layer(small_config());
  Tensor x = random_tensor({5, 12}, DType::f32, 1);
  Tensor wrong = random_tensor({5, 11}, DType::f32, 1);
  EXPECT_NE(error_of([&] { layer.forward(wrong); }).find("model_dim=12"), std::string::npos);
  EXPECT_NE(error_of([&] { layer.forward(x, top_k_only(5)); }).find("top_k"), std::string::npos);
  EXPECT_NE(error_of([&] { layer.forward(x, top_k_only(-1)); }).find("top_k"), std::string::npos);
  EXPECT_NE(error_of([&] { layer.backward(x); }).find("no forward"), std::string::npos);
  layer.forward(x);
  EXPECT_NE(error_of([&] {
              layer.backward(random_tensor({4, 12}, DType::f32, 2));
            }).find("dy"),
            std::string::npos);
  // The layer still works after the errors.
  EXPECT_EQ(layer.forward(x).y.dim(0), 5);
}

TEST(MoeLayer, SaveLoadRoundTripAndBadFilesKeepState) {
  const std::string dir = testing::TempDir();
  const std::string path = dir + "/xmoe_layer_roundtrip.safetensors";
  MoeConfig c = small_config();
  MoeLayer a(c);
  a.save(path);
  MoeConfig c2 = c;
  c2.seed_experts = 77;
  c2.seed_gate = 78;
  MoeLayer b(c2);
  Tensor x = random_tensor({20, 12}, DType::f32, 3);
  EXPECT_FALSE(bit_equal(a.forward(x).y, b.forward(x).y));
  b.load(path);
  EXPECT_TRUE(bit_equal(a.forward(x).y, b.forward(x).y));

  // A layer of another shape: the error names the tensor, and the target keeps its values.
  MoeConfig other = c;
  other.experts.hidden_size = 9;
  MoeLayer wrong(other);
  const std::string wrong_path = dir + "/xmoe_layer_wrong_shape.safetensors";
  wrong.save(wrong_path);
  const Tensor before = b.forward(x).y;
  const std::string err = error_of([&] { b.load(wrong_path); });
  EXPECT_NE(err.find("experts.batched_fc1_w"), std::string::npos) << err;
  EXPECT_NE(err.find(wrong_path), std::string::npos) << err;
  EXPECT_TRUE(bit_equal(before, b.forward(x).y));

  // Truncated file.
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string cut_path = dir + "/xmoe_layer_truncated.safetensors";
  std::ofstream(cut_path, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  EXPECT_NE(error_of([&] { b.load(cut_path); }).find(cut_path), std::string::npos);
  EXPECT_TRUE(bit_equal(before, b.forward(x).y));

  // Expert count recorded in the file must match.
  MoeConfig five = c;
  five.experts.num_experts = 5;
  MoeLayer e5(five);
  EXPECT_NE(error_of([&] { e5.load(path); }).find("_num_global_experts"), std::string::npos);
}

TEST(MoeLayer, LeadingDimsAndZeroTokens) {
  MoeLayer layer(small_config());
  Tensor x = random_tensor({3, 5, 12}, DType::f32, 4);
  ForwardResult r = layer.forward(x);
  EXPECT_EQ(r.y.shape(), Shape({3, 5, 12}));
  Tensor dx = layer.backward(random_tensor({3, 5, 12}, DType::f32, 5));
  EXPECT_EQ(dx.shape(), Shape({3, 5, 12}));
  Tensor empty = Tensor::empty({0, 12}, DType::f32);
  for (double cf : {1.0, 0.0, -1.0}) {
    ForwardResult e = layer.forward(empty, make_switches(2, cf));
    EXPECT_EQ(e.y.numel(), 0);
    EXPECT_EQ(layer.last_routing().capacity, 0);
    EXPECT_EQ(layer.backward(Tensor::empty({0, 12}, DType::f32)).numel(), 0);
  }
}

}  // namespace
}  // namespace xmoe
