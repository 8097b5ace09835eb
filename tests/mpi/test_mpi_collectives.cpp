// The MPI communicator under mpirun with 1, 2 or 4 ranks. Every payload element encodes (source rank,
// destination rank, index), DeepEP-style, so each rank checks what it received against values it computes
// itself: a block from the wrong rank or at the wrong offset cannot pass.
//
// Only rank 0 prints the usual gtest output; the other ranks print just their failures, prefixed with their
// rank. A failing check that makes ranks diverge (one skips a collective) ends in the communicator timeout,
// which CTest sets low (XMOE_COMM_TIMEOUT_S) so that such a failure is quick.
#include <gtest/gtest.h>
#include <mpi.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "mpi_test_main.hpp"
#include "xmoe/communicator.hpp"
#include "xmoe/error.hpp"
#include "xmoe/mpi.hpp"

namespace xmoe {
namespace {

// The world communicator of this test program, set once in main before the tests run.
Communicator* g_world = nullptr;
Communicator& world() {
  return *g_world;
}

template <ElementType T>
struct Native;
template <>
struct Native<ElementType::f32> {
  using type = float;
};
template <>
struct Native<ElementType::f64> {
  using type = double;
};
template <>
struct Native<ElementType::bf16> {
  using type = uint16_t;  // raw bits: bf16 only moves
};
template <>
struct Native<ElementType::i32> {
  using type = int32_t;
};
template <>
struct Native<ElementType::i64> {
  using type = int64_t;
};
template <>
struct Native<ElementType::u8> {
  using type = uint8_t;
};

// Distinct for src, dst < 16 (u8: < 4) and the first indices; exact in every type.
template <ElementType T>
typename Native<T>::type encode(int src, int dst, size_t i) {
  const uint64_t s = static_cast<uint64_t>(src), d = static_cast<uint64_t>(dst);
  if constexpr (T == ElementType::u8) return static_cast<uint8_t>((s << 6) | (d << 4) | (i & 0xf));
  if constexpr (T == ElementType::bf16) return static_cast<uint16_t>((s << 12) | (d << 8) | (i & 0xff));
  if constexpr (T == ElementType::i64)
    return static_cast<int64_t>(((s + 1) << 40) | (d << 20) | (i & 0xfffff));
  if constexpr (T == ElementType::f32 || T == ElementType::f64 || T == ElementType::i32)
    return static_cast<typename Native<T>::type>((s << 20) | (d << 12) | (i & 0xfff));
}

template <ElementType T>
void check_all_to_all(size_t count) {
  using V = typename Native<T>::type;
  Communicator& c = world();
  const int w = c.size(), me = c.rank();
  std::vector<V> send(count * w), recv(count * w, V{});
  for (int d = 0; d < w; ++d)
    for (size_t i = 0; i < count; ++i) send[d * count + i] = encode<T>(me, d, i);
  c.all_to_all(send.data(), recv.data(), count, T);
  for (int s = 0; s < w; ++s)
    for (size_t i = 0; i < count; ++i)
      ASSERT_EQ(recv[s * count + i], encode<T>(s, me, i))
          << element_type_name(T) << " from rank " << s << " index " << i << " at rank " << me;
}

TEST(MpiCollectives, WorldHasTheJobsRanks) {
  int wr = -1, ws = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &wr);
  MPI_Comm_size(MPI_COMM_WORLD, &ws);
  EXPECT_EQ(world().rank(), wr);
  EXPECT_EQ(world().size(), ws);
  EXPECT_EQ(world().name(), "world");
}

TEST(MpiCollectives, AllToAllEveryElementType) {
  for (size_t count : {size_t{0}, size_t{1}, size_t{5}, size_t{1000}}) {
    check_all_to_all<ElementType::f32>(count);
    check_all_to_all<ElementType::f64>(count);
    check_all_to_all<ElementType::bf16>(count);
    check_all_to_all<ElementType::i32>(count);
    check_all_to_all<ElementType::i64>(count);
    check_all_to_all<ElementType::u8>(count);
  }
}

TEST(MpiCollectives, AllToAllAsyncTwoInFlight) {
  Communicator& c = world();
  const int w = c.size(), me = c.rank();
  const size_t n = 257;
  std::vector<int64_t> s1(n * w), s2(n * w), r1(n * w, -1), r2(n * w, -1);
  for (int d = 0; d < w; ++d)
    for (size_t i = 0; i < n; ++i) {
      s1[d * n + i] = encode<ElementType::i64>(me, d, i);
      s2[d * n + i] = -encode<ElementType::i64>(me, d, i);
    }
  auto q1 = c.all_to_all_async(s1.data(), r1.data(), n, ElementType::i64);
  auto q2 = c.all_to_all_async(s2.data(), r2.data(), n, ElementType::i64);
  q2->wait();  // completing out of issue order is allowed
  while (!q1->test()) {
  }
  q1->wait();  // a second wait on a finished request returns at once
  for (int s = 0; s < w; ++s)
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(r1[s * n + i], encode<ElementType::i64>(s, me, i));
      ASSERT_EQ(r2[s * n + i], -encode<ElementType::i64>(s, me, i));
    }
}

// Rank s sends count(s, d) elements to rank d; some are zero. Send blocks have a one-element gap between them
// and receive blocks a two-element gap, so displacements are exercised; gaps must stay untouched.
TEST(MpiCollectives, AllToAllVUnevenAndZeroCounts) {
  Communicator& c = world();
  const int w = c.size(), me = c.rank();
  auto count = [](int s, int d) { return static_cast<int64_t>((s + 2 * d + 1) % 3) * (s + 1); };
  std::vector<int64_t> sc(w), sd(w), rc(w), rd(w);
  int64_t so = 0, ro = 0;
  for (int r = 0; r < w; ++r) {
    sc[r] = count(me, r);
    sd[r] = so;
    so += sc[r] + 1;
    rc[r] = count(r, me);
    rd[r] = ro;
    ro += rc[r] + 2;
  }
  using V = double;
  const V sentinel = -12345.0;
  std::vector<V> send(static_cast<size_t>(so), sentinel), recv(static_cast<size_t>(ro), sentinel);
  for (int d = 0; d < w; ++d)
    for (int64_t i = 0; i < sc[d]; ++i) send[sd[d] + i] = encode<ElementType::f64>(me, d, i);
  c.all_to_all_v(send.data(), sc, sd, recv.data(), rc, rd, ElementType::f64);
  for (int s = 0; s < w; ++s) {
    for (int64_t i = 0; i < rc[s]; ++i)
      ASSERT_EQ(recv[rd[s] + i], encode<ElementType::f64>(s, me, i)) << "from " << s << " index " << i;
    ASSERT_EQ(recv[rd[s] + rc[s]], sentinel) << "gap after the block from " << s << " was written";
  }
}

TEST(MpiCollectives, AllGatherAndAllGatherV) {
  Communicator& c = world();
  const int w = c.size(), me = c.rank();
  const size_t n = 3;
  std::vector<int32_t> send(n), recv(n * w, -1);
  for (size_t i = 0; i < n; ++i) send[i] = encode<ElementType::i32>(me, 0, i);
  c.all_gather(send.data(), recv.data(), n, ElementType::i32);
  for (int s = 0; s < w; ++s)
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(recv[s * n + i], encode<ElementType::i32>(s, 0, i));

  auto cnt = [](int r) { return static_cast<int64_t>(r == 1 ? 0 : r + 2); };  // rank 1 contributes nothing
  std::vector<int64_t> counts(w);
  int64_t total = 0;
  for (int r = 0; r < w; ++r) total += counts[r] = cnt(r);
  std::vector<float> vs(static_cast<size_t>(cnt(me))), vr(static_cast<size_t>(total), -1.f);
  for (size_t i = 0; i < vs.size(); ++i) vs[i] = encode<ElementType::f32>(me, 1, i);
  c.all_gather_v(vs.data(), vs.size(), vr.data(), counts, ElementType::f32);
  size_t off = 0;
  for (int s = 0; s < w; ++s)
    for (int64_t i = 0; i < counts[s]; ++i, ++off) ASSERT_EQ(vr[off], encode<ElementType::f32>(s, 1, i));
}

int64_t reduce_input(int r, size_t i) {
  return static_cast<int64_t>((r * 7 + static_cast<int>(i) * 3) % 11) - 5;
}

template <class V>
V expected_reduce(int w, size_t i, ReduceOp op, int64_t scale) {
  int64_t acc = reduce_input(0, i) * scale;
  for (int r = 1; r < w; ++r) {
    const int64_t v = reduce_input(r, i) * scale;
    acc = op == ReduceOp::sum ? acc + v : op == ReduceOp::max ? std::max(acc, v) : std::min(acc, v);
  }
  return static_cast<V>(acc);
}

template <class V>
void check_reductions(ElementType t, int64_t scale) {
  Communicator& c = world();
  const int w = c.size(), me = c.rank();
  const size_t n = 37;
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::min}) {
    std::vector<V> send(n), recv(n);
    for (size_t i = 0; i < n; ++i) send[i] = static_cast<V>(reduce_input(me, i) * scale);
    c.all_reduce(send.data(), recv.data(), n, t, op);
    for (size_t i = 0; i < n; ++i)
      ASSERT_EQ(recv[i], expected_reduce<V>(w, i, op, scale))
          << element_type_name(t) << " " << reduce_op_name(op);
    c.all_reduce(send.data(), send.data(), n, t, op);  // in place
    ASSERT_EQ(send, recv) << "in-place " << element_type_name(t) << " " << reduce_op_name(op);

    // reduce_scatter: block b of rank r holds input (r, b·n + i); rank me gets the reduction of block me.
    std::vector<V> rs_send(n * w), rs_recv(n);
    for (int b = 0; b < w; ++b)
      for (size_t i = 0; i < n; ++i) rs_send[b * n + i] = static_cast<V>(reduce_input(me, b * n + i) * scale);
    c.reduce_scatter(rs_send.data(), rs_recv.data(), n, t, op);
    for (size_t i = 0; i < n; ++i)
      ASSERT_EQ(rs_recv[i], expected_reduce<V>(w, me * n + i, op, scale))
          << "reduce_scatter " << element_type_name(t) << " " << reduce_op_name(op);
  }
}

TEST(MpiCollectives, ReductionsF32F64I32I64) {
  check_reductions<float>(ElementType::f32, 1);
  check_reductions<double>(ElementType::f64, 1);
  check_reductions<int32_t>(ElementType::i32, 1000);
  check_reductions<int64_t>(ElementType::i64, int64_t{1} << 40);  // beyond 32 bits
}

TEST(MpiCollectives, BroadcastFromEveryRoot) {
  Communicator& c = world();
  for (int root = 0; root < c.size(); ++root) {
    std::vector<uint16_t> data(11, 0);
    if (c.rank() == root)
      for (size_t i = 0; i < data.size(); ++i) data[i] = encode<ElementType::bf16>(root, 0, i);
    c.broadcast(data.data(), data.size(), ElementType::bf16, root);
    for (size_t i = 0; i < data.size(); ++i) ASSERT_EQ(data[i], encode<ElementType::bf16>(root, 0, i));
  }
  c.barrier();
}

// Checked before anything is sent, on every rank alike, so the ranks stay in step.
TEST(MpiCollectives, BadArgumentsThrowWithoutCommunicating) {
  Communicator& c = world();
  std::vector<uint16_t> b(4 * c.size());
  try {
    c.all_reduce(b.data(), b.data(), 4, ElementType::bf16, ReduceOp::sum);
    FAIL() << "bf16 all_reduce did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("all_reduce on group 'world'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("bf16"), std::string::npos) << e.what();
  }
  EXPECT_THROW(c.reduce_scatter(b.data(), b.data() + c.size(), 1, ElementType::bf16, ReduceOp::max), Error);
  try {
    c.all_to_all(nullptr, b.data(), static_cast<size_t>(INT_MAX) + 1, ElementType::f32);
    FAIL() << "count > INT_MAX did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("exceeds INT_MAX"), std::string::npos) << e.what();
  }
  std::vector<int64_t> short_counts(c.size() + 1, 0);
  EXPECT_THROW(c.all_to_all_v(b.data(), short_counts, short_counts, b.data() + 1, short_counts, short_counts,
                              ElementType::f32),
               Error);
  EXPECT_THROW(c.broadcast(b.data(), 1, ElementType::u8, c.size()), Error);
  EXPECT_THROW(c.split(-1, 0), Error);
  c.barrier();  // everyone is still in step
}

TEST(MpiCollectives, SplitOrdersByKeyAndRunsCollectivesInTheSubGroup) {
  Communicator& c = world();
  const int w = c.size(), me = c.rank();
  c.set_timeout(std::chrono::milliseconds(15000));
  const int color = me % 2;
  auto sub = c.split(color, -me);  // descending world rank
  std::vector<int> members;
  for (int r = w - 1; r >= 0; --r)
    if (r % 2 == color) members.push_back(r);
  ASSERT_EQ(sub->size(), static_cast<int>(members.size()));
  EXPECT_EQ(members[static_cast<size_t>(sub->rank())], me);
  EXPECT_EQ(sub->name(), "world/split(color=" + std::to_string(color) + ")");
  EXPECT_EQ(sub->timeout(), std::chrono::milliseconds(15000));

  std::vector<int32_t> ranks(members.size(), -1);
  const int32_t mine = me;
  sub->all_gather(&mine, ranks.data(), 1, ElementType::i32);
  EXPECT_EQ(ranks, std::vector<int32_t>(members.begin(), members.end()));

  int64_t sum = 0;
  const int64_t one = me;
  sub->all_reduce(&one, &sum, 1, ElementType::i64, ReduceOp::sum);
  int64_t want = 0;
  for (int r : members) want += r;
  EXPECT_EQ(sum, want);

  auto single = sub->split(sub->rank(), 0);  // every rank alone
  EXPECT_EQ(single->size(), 1);
  EXPECT_EQ(single->rank(), 0);
  single->barrier();
}

void check_hierarchical(HierarchicalAllToAll& h, size_t count) {
  Communicator& c = world();
  const int w = c.size(), me = c.rank();
  std::vector<int64_t> send(count * w), flat(count * w, -1), two(count * w, -2);
  for (int d = 0; d < w; ++d)
    for (size_t i = 0; i < count; ++i) send[d * count + i] = encode<ElementType::i64>(me, d, i);
  c.all_to_all(send.data(), flat.data(), count, ElementType::i64);
  h.run(send.data(), two.data(), count, ElementType::i64);
  ASSERT_EQ(two, flat) << "local_size " << h.local_size() << " count " << count;
  for (int s = 0; s < w; ++s)
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(two[s * count + i], encode<ElementType::i64>(s, me, i));
}

TEST(MpiCollectives, HierarchicalAllToAllEqualsFlat) {
  Communicator& c = world();
  const int w = c.size();
  for (int ls = 1; ls <= w; ++ls) {
    if (w % ls) continue;
    HierarchicalAllToAll h(c, ls);
    EXPECT_EQ(h.num_nodes(), w / ls);
    EXPECT_EQ(h.is_flat(), ls == 1 || ls == w);
    for (size_t count : {size_t{1}, size_t{7}, size_t{4096}, size_t{3}}) check_hierarchical(h, count);
  }
  // LOCAL_SIZE from the environment (CTest sets LOCAL_SIZE=2 for 2 and 4 ranks).
  if (const char* env = std::getenv("LOCAL_SIZE")) {
    HierarchicalAllToAll h(c, 0);
    EXPECT_EQ(h.local_size(), std::atoi(env));
    check_hierarchical(h, 9);
  }
  // f32 payloads through the two-phase path too.
  if (w % 2 == 0) {
    HierarchicalAllToAll h(c, 2);
    const size_t n = 33;
    std::vector<float> send(n * w), flat(n * w), two(n * w);
    for (int d = 0; d < w; ++d)
      for (size_t i = 0; i < n; ++i) send[d * n + i] = encode<ElementType::f32>(c.rank(), d, i);
    c.all_to_all(send.data(), flat.data(), n, ElementType::f32);
    h.run(send.data(), two.data(), n, ElementType::f32);
    EXPECT_EQ(two, flat);
  }
}

TEST(MpiCollectives, HierarchicalRejectsLocalSizeThatDoesNotDivide) {
  Communicator& c = world();
  const int bad = c.size() + 1;  // never divides
  try {
    HierarchicalAllToAll h(c, bad);
    FAIL() << "local_size " << bad << " did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("LOCAL_SIZE=" + std::to_string(bad)), std::string::npos) << e.what();
  }
}

// On ranks other than 0: report failures only, prefixed with the rank, instead of the full gtest output.
}  // namespace
}  // namespace xmoe

int main(int argc, char** argv) {
  return xmoe::testing_mpi::run_all_tests(
      argc, argv, [](std::shared_ptr<xmoe::Communicator> w) { xmoe::g_world = w.get(); });
}
