// The main() of the MPI GoogleTest programs: one MpiSession, rank 0 prints the usual output, other ranks only
// their failures (prefixed with the rank), and the job fails if any rank failed.
#pragma once
#include <gtest/gtest.h>

#include <cstdio>
#include <functional>
#include <memory>

#include "xmoe/communicator.hpp"
#include "xmoe/mpi.hpp"

namespace xmoe::testing_mpi {

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?",
                 r.line_number(), r.summary());
  }

 private:
  int rank_;
};

// Runs every test with `world` handed to set_world first (and reset before MPI finalises).
inline int run_all_tests(int argc, char** argv,
                         const std::function<void(std::shared_ptr<Communicator>)>& set_world) {
  MpiSession session(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  if (session.world_rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(session.world_rank()));
  }
  int any = 0;
  {
    std::shared_ptr<Communicator> world = session.world();
    set_world(world);
    int rc = RUN_ALL_TESTS();
    world->all_reduce(&rc, &any, 1, ElementType::i32, ReduceOp::max);
    if (any && !rc && session.world_rank() == 0)
      std::fprintf(stderr, "FAILED on another rank (see [rank N])\n");
    set_world(nullptr);
  }
  return any;
}

}  // namespace xmoe::testing_mpi
