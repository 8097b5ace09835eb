// The C ABI's communicators and expert-parallel layers (include/xmoe/c_api.h) under mpirun against the C++
// API they wrap: a session adopts the MPI that the test's MpiSession initialised (as with mpi4py), its world
// is the C++ world, collectives reduce and broadcast through DLPack views, bad tensors and ops are refused
// naming what is wrong, and a layer created in the world (its adaptive_r config field included) gives the C++
// expert-parallel layer's parameters, y, aux and dx bit for bit. (python/tests/mpi_expert_parallel.py checks
// the Python layer on top of these.)
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "layer_outcome.hpp"
#include "mpi_test_main.hpp"
#include "xmoe/c_api.h"
#include "xmoe/communicator.hpp"
#include "xmoe/moe_layer.hpp"

namespace xmoe {
namespace {

std::shared_ptr<Communicator> g_world;  // set once in main

DLTensor view(void* data, std::vector<int64_t>& shape, DLDataType dtype) {
  DLTensor t{};
  t.data = data;
  t.device = {kDLCPU, 0};
  t.ndim = static_cast<int32_t>(shape.size());
  t.dtype = dtype;
  t.shape = shape.data();
  return t;
}

DLTensor view_of(const Tensor& t, std::vector<int64_t>& shape) {
  shape.assign(t.shape().dims().begin(), t.shape().dims().end());
  return view(const_cast<void*>(static_cast<const void*>(t.raw())), shape, {kDLFloat, 32, 1});
}

std::vector<float> values(const DLManagedTensor* m) {
  int64_t n = 1;
  for (int i = 0; i < m->dl_tensor.ndim; ++i) n *= m->dl_tensor.shape[i];
  const auto* p = static_cast<const float*>(m->dl_tensor.data);
  return {p, p + n};
}

std::vector<float> values(const Tensor& t) {
  const float* p = t.data<float>();
  return {p, p + t.numel()};
}

struct Handles {
  xmoe_mpi_session* session = nullptr;
  xmoe_comm* world = nullptr;
  ~Handles() {
    xmoe_comm_destroy(world);
    xmoe_mpi_session_destroy(session);  // adopted: leaves MPI to the test's MpiSession
  }
};

TEST(CApiComm, CollectivesThroughDLPackViews) {
  ASSERT_EQ(xmoe_mpi_available(), 1);
  Handles h;
  ASSERT_EQ(xmoe_mpi_session_create(&h.session), 0) << xmoe_last_error();
  ASSERT_EQ(xmoe_mpi_session_world(h.session, &h.world), 0) << xmoe_last_error();
  const int W = g_world->size(), rank = g_world->rank();
  EXPECT_EQ(xmoe_comm_size(h.world), W);
  EXPECT_EQ(xmoe_comm_rank(h.world), rank);
  EXPECT_STREQ(xmoe_comm_name(h.world), "world");

  std::vector<int64_t> shape = {2, 3};
  std::vector<float> f(6);
  for (int i = 0; i < 6; ++i) f[static_cast<size_t>(i)] = static_cast<float>(rank * 10 + i);
  DLTensor ft = view(f.data(), shape, {kDLFloat, 32, 1});
  ASSERT_EQ(xmoe_comm_all_reduce(h.world, &ft, "sum"), 0) << xmoe_last_error();
  for (int i = 0; i < 6; ++i) EXPECT_EQ(f[static_cast<size_t>(i)], 10.0f * W * (W - 1) / 2 + W * i);
  std::vector<int64_t> one = {1};
  int64_t mine = 100 + rank;
  DLTensor it = view(&mine, one, {kDLInt, 64, 1});
  ASSERT_EQ(xmoe_comm_all_reduce(h.world, &it, "max"), 0) << xmoe_last_error();
  EXPECT_EQ(mine, 100 + W - 1);
  double d = rank == W - 1 ? 2.5 : -1.0;
  DLTensor dt = view(&d, one, {kDLFloat, 64, 1});
  ASSERT_EQ(xmoe_comm_broadcast(h.world, &dt, W - 1), 0) << xmoe_last_error();
  EXPECT_EQ(d, 2.5);
  EXPECT_EQ(xmoe_comm_barrier(h.world), 0) << xmoe_last_error();

  // Refused before any communication (so every rank refuses alike and none waits).
  EXPECT_NE(xmoe_comm_all_reduce(h.world, &ft, "prod"), 0);
  EXPECT_NE(std::string(xmoe_last_error()).find("op"), std::string::npos) << xmoe_last_error();
  std::vector<int64_t> strides = {1, 2};
  DLTensor strided = ft;
  strided.strides = strides.data();
  EXPECT_NE(xmoe_comm_all_reduce(h.world, &strided, "sum"), 0);
  EXPECT_NE(std::string(xmoe_last_error()).find("contiguous"), std::string::npos) << xmoe_last_error();
  EXPECT_NE(xmoe_comm_broadcast(h.world, &dt, W), 0);
  EXPECT_NE(std::string(xmoe_last_error()).find("root"), std::string::npos) << xmoe_last_error();

  xmoe_comm* half = nullptr;
  ASSERT_EQ(xmoe_comm_split(h.world, rank % 2, rank, &half), 0) << xmoe_last_error();
  EXPECT_EQ(xmoe_comm_size(half), (W + 1 - rank % 2) / 2);
  EXPECT_EQ(xmoe_comm_rank(half), rank / 2);
  xmoe_comm_destroy(half);
}

TEST(CApiComm, LayerInTheWorldEqualsTheCppExpertParallelLayer) {
  Handles h;
  ASSERT_EQ(xmoe_mpi_session_create(&h.session), 0) << xmoe_last_error();
  ASSERT_EQ(xmoe_mpi_session_world(h.session, &h.world), 0) << xmoe_last_error();
  const int W = g_world->size(), rank = g_world->rank();
  for (int experts : {2 * W, 1}) {
    if (experts == 1 && W == 1) continue;
    xmoe_layer_config c;
    xmoe_layer_config_init(&c);
    c.model_dim = 8;
    c.num_experts = experts;
    c.k = 1;
    c.hidden_size = 4 * W;
    c.has_fc2_bias = 0;
    c.adaptive_r = experts == 1 ? W : 1;  // sharded: r = W, which must reach the layer through the config
    c.seed_gate = 3;
    c.seed_experts = 5;
    xmoe_layer* layer = nullptr;
    ASSERT_EQ(xmoe_layer_create_in_group(&c, h.world, &layer), 0) << xmoe_last_error();

    MoeConfig m;
    m.model_dim = 8;
    m.experts.num_experts = experts;
    m.gate.k = 1;
    m.experts.hidden_size = 4 * W;
    m.experts.has_fc2_bias = false;
    m.adaptive_r = c.adaptive_r;
    m.seed_gate = 3;
    m.seed_experts = 5;
    MoeLayer ref(m, g_world);
    ASSERT_EQ(xmoe_layer_num_params(layer), static_cast<int64_t>(ref.parameters().size()));

    const Tensor x = test::random_tensor({12, 8}, DType::f32, 40 + static_cast<uint64_t>(rank));
    const Tensor dy = test::random_tensor({12, 8}, DType::f32, 50 + static_cast<uint64_t>(rank));
    std::vector<int64_t> xs, ds;
    DLTensor xv = view_of(x, xs), dyv = view_of(dy, ds);
    xmoe_switches sw;
    xmoe_switches_init(&sw);
    DLManagedTensor* y = nullptr;
    DLManagedTensor* dx = nullptr;
    double aux = 0;
    ASSERT_EQ(xmoe_layer_forward(layer, &xv, &sw, &y, &aux), 0) << xmoe_last_error();
    ASSERT_EQ(xmoe_layer_backward(layer, &dyv, 0.5, &dx), 0) << xmoe_last_error();
    const test::Outcome want = test::forward_backward(ref, x, dy, Switches{});
    EXPECT_EQ(values(y), values(want.y)) << experts << " experts";
    EXPECT_EQ(aux, want.aux);
    EXPECT_EQ(values(dx), values(want.dx));
    for (int64_t i = 0; i < xmoe_layer_num_params(layer); ++i) {
      const char* name = nullptr;
      DLTensor v{};
      ASSERT_EQ(xmoe_layer_param(layer, i, &name, nullptr, &v), 0) << xmoe_last_error();
      const Parameter& p = *ref.parameters()[static_cast<size_t>(i)];
      EXPECT_EQ(name, p.name);
      ASSERT_EQ(v.ndim, p.value.ndim()) << name;
      for (int j = 0; j < v.ndim; ++j) EXPECT_EQ(v.shape[j], p.value.dim(j)) << name;
      EXPECT_EQ(std::memcmp(v.data, p.value.raw(), static_cast<size_t>(p.value.numel()) * sizeof(float)), 0)
          << name;
    }
    y->deleter(y);
    dx->deleter(dx);
    xmoe_layer_destroy(layer);
  }
}

}  // namespace
}  // namespace xmoe

int main(int argc, char** argv) {
  return xmoe::testing_mpi::run_all_tests(
      argc, argv, [](std::shared_ptr<xmoe::Communicator> w) { xmoe::g_world = std::move(w); });
}
