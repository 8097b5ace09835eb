// The single-process communicator: every collective with size 1 is a copy, and bad arguments fail with the
// same checks the MPI backend applies.
#include <gtest/gtest.h>

#include <climits>
#include <cstdlib>
#include <numeric>
#include <vector>

#include "xmoe/communicator.hpp"
#include "xmoe/error.hpp"

namespace xmoe {
namespace {

std::vector<float> iota_f(size_t n, float start) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

TEST(LocalCommunicator, RankSizeName) {
  auto c = make_local_communicator();
  EXPECT_EQ(c->rank(), 0);
  EXPECT_EQ(c->size(), 1);
  EXPECT_EQ(c->name(), "local");
}

TEST(LocalCommunicator, AllToAllAndAsyncCopy) {
  auto c = make_local_communicator();
  const auto send = iota_f(7, 1.f);
  std::vector<float> recv(7, 0.f);
  c->all_to_all(send.data(), recv.data(), 7, ElementType::f32);
  EXPECT_EQ(recv, send);
  std::vector<float> recv2(7, 0.f);
  auto req = c->all_to_all_async(send.data(), recv2.data(), 7, ElementType::f32);
  req->wait();
  EXPECT_TRUE(req->test());
  EXPECT_EQ(recv2, send);
}

TEST(LocalCommunicator, AllToAllVHonoursDisplacementsAndZeroCounts) {
  auto c = make_local_communicator();
  const std::vector<int64_t> send{0, 0, 11, 12, 13};
  std::vector<int64_t> recv(6, -1);
  const int64_t sc[] = {3}, sd[] = {2}, rc[] = {3}, rd[] = {1};
  c->all_to_all_v(send.data(), sc, sd, recv.data(), rc, rd, ElementType::i64);
  EXPECT_EQ(recv, (std::vector<int64_t>{-1, 11, 12, 13, -1, -1}));
  const int64_t zero[] = {0};
  c->all_to_all_v(send.data(), zero, sd, recv.data(), zero, rd, ElementType::i64);  // moves nothing
  EXPECT_EQ(recv[1], 11);
  const int64_t rc_bad[] = {2};
  EXPECT_THROW(c->all_to_all_v(send.data(), sc, sd, recv.data(), rc_bad, rd, ElementType::i64), Error);
  const int64_t two[] = {1, 1};
  EXPECT_THROW(c->all_to_all_v(send.data(), two, sd, recv.data(), rc, rd, ElementType::i64), Error);
  const int64_t neg[] = {-1};
  EXPECT_THROW(c->all_to_all_v(send.data(), neg, sd, recv.data(), neg, rd, ElementType::i64), Error);
}

TEST(LocalCommunicator, AllGatherAndAllGatherV) {
  auto c = make_local_communicator();
  const std::vector<double> send{1.5, 2.5, 3.5};
  std::vector<double> recv(3, 0.0);
  c->all_gather(send.data(), recv.data(), 3, ElementType::f64);
  EXPECT_EQ(recv, send);
  std::vector<double> recv2(3, 0.0);
  const int64_t counts[] = {3};
  c->all_gather_v(send.data(), 3, recv2.data(), counts, ElementType::f64);
  EXPECT_EQ(recv2, send);
  const int64_t wrong[] = {2};
  EXPECT_THROW(c->all_gather_v(send.data(), 3, recv2.data(), wrong, ElementType::f64), Error);
}

TEST(LocalCommunicator, ReductionsAreCopiesAndInPlaceAllReduceWorks) {
  auto c = make_local_communicator();
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::min}) {
    const std::vector<int32_t> send{-3, 4, 5};
    std::vector<int32_t> recv(3, 0);
    c->all_reduce(send.data(), recv.data(), 3, ElementType::i32, op);
    EXPECT_EQ(recv, send) << reduce_op_name(op);
    std::vector<int32_t> rs(3, 0);
    c->reduce_scatter(send.data(), rs.data(), 3, ElementType::i32, op);
    EXPECT_EQ(rs, send) << reduce_op_name(op);
  }
  std::vector<float> inplace{1.f, 2.f};
  c->all_reduce(inplace.data(), inplace.data(), 2, ElementType::f32, ReduceOp::sum);
  EXPECT_EQ(inplace, (std::vector<float>{1.f, 2.f}));
}

TEST(LocalCommunicator, Bf16MovesButDoesNotReduce) {
  auto c = make_local_communicator();
  const std::vector<uint16_t> send{0x3f80, 0x4000};
  std::vector<uint16_t> recv(2, 0);
  c->all_to_all(send.data(), recv.data(), 2, ElementType::bf16);
  EXPECT_EQ(recv, send);
  try {
    c->all_reduce(send.data(), recv.data(), 2, ElementType::bf16, ReduceOp::sum);
    FAIL() << "bf16 all_reduce did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bf16"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("all_reduce on group 'local'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(c->reduce_scatter(send.data(), recv.data(), 2, ElementType::bf16, ReduceOp::max), Error);
}

TEST(LocalCommunicator, BroadcastBarrierSplit) {
  auto c = make_local_communicator();
  std::vector<uint8_t> data{1, 2, 3};
  c->broadcast(data.data(), 3, ElementType::u8, 0);
  EXPECT_EQ(data, (std::vector<uint8_t>{1, 2, 3}));
  EXPECT_THROW(c->broadcast(data.data(), 3, ElementType::u8, 1), Error);
  c->barrier();
  c->set_timeout(std::chrono::milliseconds(1234));
  auto s = c->split(7, 0);
  EXPECT_EQ(s->size(), 1);
  EXPECT_EQ(s->rank(), 0);
  EXPECT_EQ(s->name(), "local/split(color=7)");
  EXPECT_EQ(s->timeout(), std::chrono::milliseconds(1234));
  EXPECT_THROW(c->split(-1, 0), Error);
}

TEST(LocalCommunicator, SameBufferIsRejectedExceptForAllReduce) {
  auto c = make_local_communicator();
  std::vector<float> buf(4, 1.f);
  EXPECT_THROW(c->all_to_all(buf.data(), buf.data(), 4, ElementType::f32), Error);
  EXPECT_THROW(c->all_gather(buf.data(), buf.data(), 4, ElementType::f32), Error);
}

TEST(LocalCommunicator, HierarchicalAllToAllDegradesToFlat) {
  auto c = make_local_communicator();
  HierarchicalAllToAll h(*c, 1);
  EXPECT_TRUE(h.is_flat());
  EXPECT_EQ(h.num_nodes(), 1);
  const auto send = iota_f(5, 0.f);
  std::vector<float> recv(5, 0.f);
  h.run(send.data(), recv.data(), 5, ElementType::f32);
  EXPECT_EQ(recv, send);
  try {
    HierarchicalAllToAll bad(*c, 2);
    FAIL() << "local_size 2 on one rank did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("LOCAL_SIZE=2"), std::string::npos) << e.what();
  }
}

TEST(CommunicatorEnv, TimeoutAndLocalSizeFromEnvironment) {
  // Restores the variables it changes so that other tests in this process see the environment they expect.
  const char* old_t = std::getenv("XMOE_COMM_TIMEOUT_S");
  const std::string saved_t = old_t ? old_t : "";
  const char* old_l = std::getenv("LOCAL_SIZE");
  const std::string saved_l = old_l ? old_l : "";
  unsetenv("XMOE_COMM_TIMEOUT_S");
  EXPECT_EQ(comm_timeout_from_env(), std::chrono::milliseconds(300000));
  setenv("XMOE_COMM_TIMEOUT_S", "2.5", 1);
  EXPECT_EQ(comm_timeout_from_env(), std::chrono::milliseconds(2500));
  EXPECT_EQ(make_local_communicator()->timeout(), std::chrono::milliseconds(2500));
  setenv("XMOE_COMM_TIMEOUT_S", "soon", 1);
  EXPECT_THROW(comm_timeout_from_env(), Error);
  setenv("XMOE_COMM_TIMEOUT_S", "-1", 1);
  EXPECT_THROW(comm_timeout_from_env(), Error);
  unsetenv("LOCAL_SIZE");
  EXPECT_THROW(local_size_from_env(), Error);
  setenv("LOCAL_SIZE", "4", 1);
  EXPECT_EQ(local_size_from_env(), 4);
  setenv("LOCAL_SIZE", "0", 1);
  EXPECT_THROW(local_size_from_env(), Error);
  if (old_t)
    setenv("XMOE_COMM_TIMEOUT_S", saved_t.c_str(), 1);
  else
    unsetenv("XMOE_COMM_TIMEOUT_S");
  if (old_l)
    setenv("LOCAL_SIZE", saved_l.c_str(), 1);
  else
    unsetenv("LOCAL_SIZE");
}

TEST(ElementTypes, SizesAndNames) {
  EXPECT_EQ(element_size(ElementType::f32), 4u);
  EXPECT_EQ(element_size(ElementType::f64), 8u);
  EXPECT_EQ(element_size(ElementType::bf16), 2u);
  EXPECT_EQ(element_size(ElementType::i32), 4u);
  EXPECT_EQ(element_size(ElementType::i64), 8u);
  EXPECT_EQ(element_size(ElementType::u8), 1u);
  EXPECT_STREQ(element_type_name(ElementType::bf16), "bf16");
}

}  // namespace
}  // namespace xmoe
