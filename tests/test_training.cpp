// Sgd and Adam against torch.optim (tools/make_optimizer_fixtures.py), and the gradient split of training.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "xmoe/training.hpp"

namespace xmoe {
namespace {

TEST(Optimizers, MatchTorchOptim) {
  std::ifstream in(std::string(XMOE_TEST_DATA_DIR) + "/optim/optimizers.json");
  ASSERT_TRUE(in) << "missing optimizer fixtures";
  const nlohmann::json cases = nlohmann::json::parse(in);
  ASSERT_EQ(cases.size(), 4u);
  for (const auto& c : cases) {
    MoeConfig cfg;
    cfg.model_dim = 6;
    cfg.dtype = DType::f64;
    cfg.gate.k = 1;
    cfg.experts.num_experts = 4;
    cfg.experts.hidden_size = 2;
    MoeLayer layer(cfg);
    Parameter& wg = layer.parameter("gate.wg");  // [4, 6]
    const auto& o = c["options"];
    std::vector<double> init = c["initial"];
    for (size_t i = 0; i < init.size(); ++i) wg.value.set(static_cast<int64_t>(i), init[i]);
    auto run = [&](auto& opt) {
      for (const auto& g : c["grads"]) {
        layer.zero_grad();
        std::vector<double> gv = g;
        for (size_t i = 0; i < gv.size(); ++i) wg.grad.set(static_cast<int64_t>(i), gv[i]);
        opt.step(layer);
      }
    };
    if (c["kind"] == "sgd") {
      Sgd opt({o.value("lr", 0.0), o.value("momentum", 0.0), o.value("weight_decay", 0.0)});
      run(opt);
    } else {
      Adam opt({o.value("lr", 0.0), o.value("beta1", 0.9), o.value("beta2", 0.999), o.value("eps", 1e-8),
                o.value("weight_decay", 0.0)});
      run(opt);
    }
    std::vector<double> want = c["expected"];
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_NEAR(wg.value.get(static_cast<int64_t>(i)), want[i], 1e-12)
          << c["kind"] << " " << o.dump() << " [" << i << "]";
  }
}

TEST(Optimizers, BadOptionsNameTheField) {
  EXPECT_THROW(Sgd({-1.0, 0, 0}), Error);
  try {
    Adam({1e-3, 1.5, 0.999, 1e-8, 0});
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("adam.beta1"), std::string::npos);
  }
}

TEST(Training, AverageSharedGradientsLeavesExpertGradients) {
  MoeConfig cfg;
  cfg.model_dim = 4;
  cfg.experts.num_experts = 2;
  cfg.experts.hidden_size = 3;
  cfg.gate.k = 1;
  MoeLayer layer(cfg);
  for (Parameter* p : layer.parameters()) p->grad.set(0, 3.0);
  auto local = make_local_communicator();
  average_shared_gradients(layer, *local);  // size 1: divide by 1, sum of one
  for (Parameter* p : layer.parameters()) EXPECT_EQ(p->grad.get(0), 3.0) << p->name;
}

}  // namespace
}  // namespace xmoe
