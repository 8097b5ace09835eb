// The C ABI (include/xmoe/c_api.h) against the C++ API it wraps: the same layer (config and seeds) gives the
// same y, aux loss, dx and parameter gradients bit for bit through DLPack views of caller memory, including
// after the parameters are rebound to that memory; bad tensors are refused with a message naming them, and
// the layer stays usable. (The numerics themselves are checked against PyTorch by python/tests and
// test_layer_oracle.)
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "xmoe/c_api.h"
#include "xmoe/moe_layer.hpp"

namespace {

DLTensor view(void* data, std::vector<int64_t>& shape, DLDataType dtype) {
  DLTensor t{};
  t.data = data;
  t.device = {kDLCPU, 0};
  t.ndim = static_cast<int32_t>(shape.size());
  t.dtype = dtype;
  t.shape = shape.data();
  return t;
}

constexpr DLDataType kF32{kDLFloat, 32, 1};

std::vector<float> values(const DLManagedTensor* m) {
  int64_t n = 1;
  for (int i = 0; i < m->dl_tensor.ndim; ++i) n *= m->dl_tensor.shape[i];
  const auto* p = static_cast<const float*>(m->dl_tensor.data);
  return {p, p + n};
}

std::vector<float> values(const xmoe::Tensor& t) {
  const float* p = t.data<float>();
  return {p, p + t.numel()};
}

TEST(CApi, LayerEqualsTheCppLayerThroughCallerMemory) {
  xmoe_layer_config c;
  xmoe_layer_config_init(&c);
  c.model_dim = 8;
  c.num_experts = 4;
  c.hidden_size = 6;
  c.capacity_factor = 0.5;  // drops
  c.activation = "gelu";
  xmoe_layer* layer = nullptr;
  ASSERT_EQ(xmoe_layer_create(&c, &layer), 0) << xmoe_last_error();

  xmoe::MoeConfig m;
  m.model_dim = 8;
  m.experts.num_experts = 4;
  m.experts.hidden_size = 6;
  m.gate.capacity_factor = 0.5;
  m.experts.activation = "gelu";
  xmoe::MoeLayer ref(m);

  // Rebind every parameter to caller memory holding the same values, and the gradients to zeroed memory.
  const int64_t n = xmoe_layer_num_params(layer);
  ASSERT_EQ(n, static_cast<int64_t>(ref.parameters().size()));
  std::vector<std::vector<float>> vals(static_cast<size_t>(n)), grads(static_cast<size_t>(n));
  std::vector<std::vector<int64_t>> shapes(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const char* name = nullptr;
    int32_t is_expert = 0;
    DLTensor v{};
    ASSERT_EQ(xmoe_layer_param(layer, i, &name, &is_expert, &v), 0) << xmoe_last_error();
    const xmoe::Parameter& p = *ref.parameters()[static_cast<size_t>(i)];
    EXPECT_EQ(name, p.name);
    EXPECT_EQ(is_expert != 0, p.is_expert);
    auto& s = shapes[static_cast<size_t>(i)];
    s.assign(v.shape, v.shape + v.ndim);
    vals[static_cast<size_t>(i)] = values(p.value);
    grads[static_cast<size_t>(i)].assign(vals[static_cast<size_t>(i)].size(), 0.0f);
    DLTensor nv = view(vals[static_cast<size_t>(i)].data(), s, kF32);
    DLTensor ng = view(grads[static_cast<size_t>(i)].data(), s, kF32);
    ASSERT_EQ(xmoe_layer_bind_param(layer, i, &nv, &ng), 0) << xmoe_last_error();
  }

  std::vector<int64_t> xs = {3, 5, 8};
  std::vector<float> x(120), dy(120);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * static_cast<float>(i)) * 2.0f;
  for (size_t i = 0; i < dy.size(); ++i) dy[i] = std::cos(0.11f * static_cast<float>(i));
  DLTensor xv = view(x.data(), xs, kF32), dyv = view(dy.data(), xs, kF32);
  xmoe_switches sw;
  xmoe_switches_init(&sw);
  DLManagedTensor* y = nullptr;
  double aux = 0;
  ASSERT_EQ(xmoe_layer_forward(layer, &xv, &sw, &y, &aux), 0) << xmoe_last_error();
  DLManagedTensor* dx = nullptr;
  ASSERT_EQ(xmoe_layer_backward(layer, &dyv, 0.5, &dx), 0) << xmoe_last_error();

  const xmoe::Tensor xt = xmoe::Tensor::wrap(x.data(), xmoe::Shape{3, 5, 8}, xmoe::DType::f32, nullptr);
  const xmoe::ForwardResult r = ref.forward(xt);
  const xmoe::Tensor dxr =
      ref.backward(xmoe::Tensor::wrap(dy.data(), xmoe::Shape{3, 5, 8}, xmoe::DType::f32, nullptr), 0.5);
  EXPECT_EQ(values(y), values(r.y));
  EXPECT_EQ(aux, r.aux_loss);
  EXPECT_EQ(values(dx), values(dxr));
  for (int64_t i = 0; i < n; ++i)
    EXPECT_EQ(grads[static_cast<size_t>(i)], values(ref.parameters()[static_cast<size_t>(i)]->grad)) << i;
  y->deleter(y);
  dx->deleter(dx);

  // Refused tensors: the message names what is wrong; the layer keeps working.
  DLTensor gpu = xv;
  gpu.device = {kDLCUDA, 0};
  EXPECT_NE(xmoe_layer_forward(layer, &gpu, &sw, &y, &aux), 0);
  EXPECT_NE(std::string(xmoe_last_error()).find("CPU"), std::string::npos) << xmoe_last_error();
  std::vector<int64_t> strides = {40, 1, 5};
  DLTensor strided = xv;
  strided.strides = strides.data();
  EXPECT_NE(xmoe_layer_forward(layer, &strided, &sw, &y, &aux), 0);
  EXPECT_NE(std::string(xmoe_last_error()).find("contiguous"), std::string::npos) << xmoe_last_error();
  std::vector<int64_t> bad_shape = {2, 2};
  DLTensor bad = view(vals[0].data(), bad_shape, kF32);
  EXPECT_NE(xmoe_layer_bind_param(layer, 0, &bad, nullptr), 0);
  EXPECT_NE(std::string(xmoe_last_error()).find("gate.wg"), std::string::npos) << xmoe_last_error();
  EXPECT_NE(xmoe_layer_bind_param(layer, n, nullptr, nullptr), 0);
  ASSERT_EQ(xmoe_layer_forward(layer, &xv, &sw, &y, &aux), 0) << xmoe_last_error();
  EXPECT_EQ(values(y), values(r.y));
  y->deleter(y);
  xmoe_layer_destroy(layer);

  c.gate_type = "nope";
  xmoe_layer* refused = nullptr;
  EXPECT_NE(xmoe_layer_create(&c, &refused), 0);
  EXPECT_NE(std::string(xmoe_last_error()).find("gate.type"), std::string::npos) << xmoe_last_error();
}

// The expert-parallel fields start at MoeConfig's defaults; without a group (or with a bad overlap degree)
// the layer is the single-process one (or refused naming the field). The communicator functions are exercised
// under mpirun by python/tests/mpi_expert_parallel.py.
TEST(CApi, ExpertParallelFieldsDefaultToTheCppLayersAndNoGroupIsOneProcess) {
  xmoe_layer_config c;
  xmoe_layer_config_init(&c);
  const xmoe::MoeConfig m;
  EXPECT_EQ(c.adaptive_r, m.adaptive_r);
  EXPECT_EQ(c.a2a_overlap_degree, m.a2a_overlap_degree);
  EXPECT_EQ(c.use_2dh != 0, m.use_2dh);
  EXPECT_EQ(c.local_size, m.local_size);
  c.model_dim = 8;
  c.num_experts = 4;
  c.hidden_size = 6;
  xmoe_layer* layer = nullptr;
  ASSERT_EQ(xmoe_layer_create_in_group(&c, nullptr, &layer), 0) << xmoe_last_error();
  EXPECT_EQ(xmoe_layer_output_dim(layer), 8);
  xmoe_layer_destroy(layer);
  c.a2a_overlap_degree = 0;
  EXPECT_NE(xmoe_layer_create_in_group(&c, nullptr, &layer), 0);
  EXPECT_NE(std::string(xmoe_last_error()).find("a2a_overlap_degree"), std::string::npos)
      << xmoe_last_error();
}

}  // namespace
