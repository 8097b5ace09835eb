// gpt-oss's MoE parts on their own against transformers' GptOssTopKRouter and GptOssExperts modules
// (tools/make_gpt_oss_fixtures.py writes tests/data/gpt_oss/experts.safetensors): the linear router with bias
// and top-k softmax, and the clamped SwiGLU experts over interleaved gate/up rows with biases, on f32 weights
// and on the published MXFP4 codes read in place.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu_features.hpp"
#include "kernels/kernels.hpp"
#include "kernels/linear.hpp"
#include "moe/linear_router.hpp"
#include "moe/routed_experts.hpp"
#include "xmoe/error.hpp"
#include "xmoe/safetensors.hpp"

namespace xmoe::moe {
namespace {

using kernels::PackedWeight;

struct Fixture {
  SafetensorsFile file =
      SafetensorsFile::open(std::string(XMOE_TEST_DATA_DIR) + "/gpt_oss/experts.safetensors");
  std::vector<int64_t> shape(const std::string& name) const {
    const Tensor t = file.tensor(name);  // the shape's span points into the tensor: keep it alive
    const auto d = t.shape().dims();
    return {d.begin(), d.end()};
  }
  std::vector<float> f32(const std::string& name) const {
    const Tensor t = file.tensor(name);
    return std::vector<float>(t.data<float>(), t.data<float>() + t.numel());
  }
  std::vector<int32_t> i32(const std::string& name) const {
    const auto b = file.bytes(name);
    std::vector<int32_t> v(b.size() / 4);
    std::memcpy(v.data(), b.data(), b.size());
    return v;
  }
};

PackedWeight f32_view(const float* data, int64_t rows, int64_t cols) {
  PackedWeight w;
  w.format = kernels::WeightFormat::f32;
  w.rows = rows;
  w.cols = cols;
  w.data = reinterpret_cast<const std::byte*>(data);
  w.row_bytes = cols * 4;
  return w;
}

PackedWeight mxfp4_view(const Fixture& f, const std::string& name, int64_t e, int64_t rows, int64_t cols) {
  const auto blocks = f.file.bytes(name + "_blocks");
  const auto scales = f.file.bytes(name + "_scales");
  PackedWeight w;
  w.format = kernels::WeightFormat::mxfp4;
  w.rows = rows;
  w.cols = cols;
  w.row_bytes = cols / 2;
  w.data = reinterpret_cast<const std::byte*>(blocks.data()) + e * rows * w.row_bytes;
  w.scale_type = kernels::ScaleType::e8m0;
  w.scales = reinterpret_cast<const std::byte*>(scales.data()) + e * rows * (cols / 32);
  w.scale_row_stride = cols / 32;
  w.block_cols = 32;
  return w;
}

double rel_error(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, ref = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    ref = std::max(ref, std::abs(static_cast<double>(b[i])));
  }
  return diff / ref;
}

class GptOssMoe : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto gu = f.shape("gate_up_proj");  // [E, H, 2I]
    E = gu[0];
    H = gu[1];
    I = gu[2] / 2;
    T = f.shape("x")[0];
    k = static_cast<int>(f.shape("router_scores")[1]);
    x = f.f32("x");
    // transformers holds gate_up_proj as [E, H, 2I] (x @ W): our linears take [2I, H] rows, so transpose.
    const std::vector<float> gate_up = f.f32("gate_up_proj"), down = f.f32("down_proj");
    gate_up_t.resize(gate_up.size());
    down_t.resize(down.size());
    for (int64_t e = 0; e < E; ++e) {
      for (int64_t h = 0; h < H; ++h)
        for (int64_t n = 0; n < 2 * I; ++n)
          gate_up_t[(e * 2 * I + n) * H + h] = gate_up[(e * H + h) * 2 * I + n];
      for (int64_t i = 0; i < I; ++i)
        for (int64_t h = 0; h < H; ++h) down_t[(e * H + h) * I + i] = down[(e * I + i) * H + h];
    }
  }

  std::vector<SwigluWeights> experts(bool mxfp4) const {
    const std::vector<float> gub = f.f32("gate_up_proj_bias"), db = f.f32("down_proj_bias");
    std::vector<SwigluWeights> ws(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) {
      SwigluWeights& w = ws[static_cast<size_t>(e)];
      w.gate_up = mxfp4 ? mxfp4_view(f, "gate_up_proj", e, 2 * I, H)
                        : f32_view(gate_up_t.data() + e * 2 * I * H, 2 * I, H);
      w.down = mxfp4 ? mxfp4_view(f, "down_proj", e, H, I) : f32_view(down_t.data() + e * H * I, H, I);
      w.gate_up_bias.assign(gub.begin() + e * 2 * I, gub.begin() + (e + 1) * 2 * I);
      w.down_bias.assign(db.begin() + e * H, db.begin() + (e + 1) * H);
    }
    return ws;
  }

  std::vector<float> run_experts(bool mxfp4, const kernels::KernelTable& table) const {
    RoutedExperts re(experts(mxfp4), table, ExpertDescriptor::gpt_oss(1.702f, 7.0f));
    const std::vector<int32_t> ids = f.i32("router_indices");
    const std::vector<float> scores = f.f32("router_scores");
    std::vector<float> y(static_cast<size_t>(T * H));
    re.forward(x.data(), T, k, ids.data(), scores.data(), y.data());
    return y;
  }

  Fixture f;
  int64_t E = 0, H = 0, I = 0, T = 0;
  int k = 0;
  std::vector<float> x, gate_up_t, down_t;
};

TEST_F(GptOssMoe, RouterMatchesTransformers) {
  const std::vector<float> w = f.f32("router.weight");
  LlmRouterConfig cfg;
  cfg.type = LlmRouterType::gpt_oss;
  cfg.num_experts = static_cast<int>(E);
  cfg.top_k = k;
  LinearRouter router(f32_view(w.data(), E, H), f.f32("router.bias"), cfg, kernels::reference_kernel_table());
  std::vector<int32_t> ids(static_cast<size_t>(T * k));
  std::vector<float> weights(ids.size());
  router.route(x.data(), T, ids.data(), weights.data());
  EXPECT_EQ(ids, f.i32("router_indices"));
  EXPECT_LT(rel_error(weights, f.f32("router_scores")), 1e-6);
  // Without the bias the choices change: the bias is really applied.
  LinearRouter unbiased(f32_view(w.data(), E, H), {}, cfg, kernels::reference_kernel_table());
  std::vector<int32_t> ids2(ids.size());
  unbiased.route(x.data(), T, ids2.data(), weights.data());
  EXPECT_NE(ids2, ids);
}

TEST_F(GptOssMoe, ClampedSwigluExpertsMatchTransformers) {
  const std::vector<float> want = f.f32("out");
  const std::vector<float> ref = run_experts(false, kernels::reference_kernel_table());
  EXPECT_LT(rel_error(ref, want), 1e-5);
  // Plain SwiGLU over the same weights is far off: the clamp, the +1 and alpha matter on these inputs.
  ExpertDescriptor plain = ExpertDescriptor::gpt_oss(1.702f, 7.0f);
  plain.activation = GatedActivation::swiglu;
  RoutedExperts re(experts(false), kernels::reference_kernel_table(), plain);
  std::vector<float> y(want.size());
  re.forward(x.data(), T, k, f.i32("router_indices").data(), f.f32("router_scores").data(), y.data());
  EXPECT_GT(rel_error(y, want), 1e-2);
}

TEST_F(GptOssMoe, Mxfp4ExpertsMatchTransformersOnDequantisedWeights) {
  const std::vector<float> ref = run_experts(true, kernels::reference_kernel_table());
  EXPECT_LT(rel_error(ref, f.f32("out_mxfp4")), 1e-5);
}

TEST_F(GptOssMoe, EveryIsaAndThreadCountGivesTheReferenceBits) {
  const kernels::CpuFeatures features = kernels::detect_cpu_features();
  for (bool mxfp4 : {false, true}) {
    const std::vector<float> ref = run_experts(mxfp4, kernels::reference_kernel_table());
    for (const char* isa : {"avx2", "avx512"}) {
      if (!kernels::isa_supported(features, kernels::parse_isa(isa))) continue;
      const kernels::KernelTable& table = kernels::kernel_table(kernels::parse_isa(isa), features);
      for (int threads : {1, 3}) {
        omp_set_num_threads(threads);
        EXPECT_EQ(run_experts(mxfp4, table), ref) << isa << " threads " << threads << " mxfp4 " << mxfp4;
      }
    }
  }
}

TEST_F(GptOssMoe, DescriptorMismatchIsNamed) {
  // Interleaved experts given separate gate/up weights, and a missing bias.
  std::vector<SwigluWeights> ws = experts(false);
  ws[1].gate = kernels::slice_rows(ws[1].gate_up, 0, I);
  ws[1].up = kernels::slice_rows(ws[1].gate_up, I, I);
  ws[1].gate_up = {};
  try {
    PackedSwigluExperts bad(ws, kernels::reference_kernel_table(), ExpertDescriptor::gpt_oss(1.702f, 7.0f));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expert 1 (clamped_swiglu"), std::string::npos) << e.what();
  }
  ws = experts(false);
  ws[2].down_bias.clear();
  EXPECT_THROW(
      PackedSwigluExperts(ws, kernels::reference_kernel_table(), ExpertDescriptor::gpt_oss(1.702f, 7.0f)),
      Error);
}

}  // namespace
}  // namespace xmoe::moe
