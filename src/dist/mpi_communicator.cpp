// The MPI backend. Every collective is issued non-blocking (MPI_I*) and completed by polling MPI_Test
// against a deadline, because a blocking MPI collective waits forever when a peer died or never called it;
// polling lets us name the rank, collective and group and end the job instead of hanging it.
#include <mpi.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <thread>
#include <vector>

#include "dist/checks.hpp"
#include "xmoe/error.hpp"
#include "xmoe/mpi.hpp"

namespace xmoe {

namespace {

using Clock = std::chrono::steady_clock;

std::string mpi_error_string(int rc) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, buf, &len) != MPI_SUCCESS) return detail::concat("MPI error ", rc);
  return std::string(buf, static_cast<size_t>(len));
}

void check_mpi(int rc, const char* call, const char* what, const std::string& group) {
  XMOE_CHECK(rc == MPI_SUCCESS, what, " on group '", group, "': ", call, " failed: ", mpi_error_string(rc));
}

MPI_Datatype mpi_type(ElementType t) {
  switch (t) {
    case ElementType::f32:
      return MPI_FLOAT;
    case ElementType::f64:
      return MPI_DOUBLE;
    case ElementType::bf16:
      return MPI_UINT16_T;  // moved as opaque 2-byte words; never reduced
    case ElementType::i32:
      return MPI_INT32_T;
    case ElementType::i64:
      return MPI_INT64_T;
    case ElementType::u8:
      return MPI_UINT8_T;
  }
  throw Error(detail::concat("MPI backend: unknown ElementType ", static_cast<int>(t)));
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return MPI_SUM;
    case ReduceOp::max:
      return MPI_MAX;
    case ReduceOp::min:
      return MPI_MIN;
  }
  throw Error(detail::concat("MPI backend: unknown ReduceOp ", static_cast<int>(op)));
}

// Open MPI 4 has no large-count (MPI_Count) collectives, so every count and displacement is an int.
int to_int(uint64_t v, const char* field, const char* what, const std::string& group) {
  XMOE_CHECK(v <= static_cast<uint64_t>(INT_MAX), what, " on group '", group, "': ", field, " = ", v,
             " elements exceeds INT_MAX (", INT_MAX, "), the most one MPI call can move; split the message");
  return static_cast<int>(v);
}

int world_rank_or_minus_one() {
  int r = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

// Completes `req` or ends the job. Polls MPI_Test in a tight loop, as a blocking Open MPI collective polls
// its progress engine: Open MPI's non-blocking collectives (libnbc) advance only inside MPI_Test, so any
// pause between tests (a sched_yield measured 3x slower at 1 MiB) delays every round of the algorithm. Open
// MPI already yields inside MPI_Test when ranks outnumber cores. The clock is read every 256 tests only.
// After 10 s of waiting the job is badly out of step and the loop sleeps 100 us between tests instead of
// burning a core. On expiry it aborts with exit code 3: the peers that did arrive are blocked in the same
// collective and MPI cannot cancel a collective, so the job cannot continue consistently.
void wait_bounded(MPI_Request* req, MPI_Comm abort_comm, const char* what, const std::string& group,
                  std::chrono::milliseconds timeout) {
  constexpr uint64_t kTestsPerClockRead = 256;
  constexpr std::chrono::seconds kSpinFor(10);
  const Clock::time_point start = Clock::now();
  const Clock::time_point deadline = start + timeout;
  bool spinning = true;
  for (uint64_t i = 1;; ++i) {
    int done = 0;
    check_mpi(MPI_Test(req, &done, MPI_STATUS_IGNORE), "MPI_Test", what, group);
    if (done) return;
    if (spinning && i % kTestsPerClockRead) continue;
    const Clock::time_point now = Clock::now();
    if (now >= deadline) {
      std::fprintf(
          stderr,
          "xmoe: rank %d: %s on group '%s' timed out after %g s (a peer rank died or never arrived)\n",
          world_rank_or_minus_one(), what, group.c_str(), std::chrono::duration<double>(timeout).count());
      std::fflush(stderr);
      MPI_Abort(abort_comm, 3);
      std::_Exit(3);  // MPI_Abort does not return in practice; make sure the process does not go on
    }
    spinning = now - start < kSpinFor;
    if (!spinning) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

// A started all-to-all. Aborts through MPI_COMM_WORLD (Open MPI ends the whole job either way) so that a
// request that outlives its communicator never uses a freed handle.
class MpiRequest final : public CommRequest {
 public:
  MpiRequest(MPI_Request req, std::string group, std::chrono::milliseconds timeout)
      : req_(req), group_(std::move(group)), timeout_(timeout) {}
  ~MpiRequest() override {
    if (done_) return;
    try {
      wait();
    } catch (const std::exception& e) {  // destructors must not throw; the job is broken anyway
      std::fprintf(stderr, "xmoe: %s\n", e.what());
      MPI_Abort(MPI_COMM_WORLD, 3);
    }
  }
  void wait() override {
    if (done_) return;
    wait_bounded(&req_, MPI_COMM_WORLD, "all_to_all_async", group_, timeout_);
    done_ = true;
  }
  bool test() override {
    if (done_) return true;
    int flag = 0;
    check_mpi(MPI_Test(&req_, &flag, MPI_STATUS_IGNORE), "MPI_Test", "all_to_all_async", group_);
    done_ = flag != 0;
    return done_;
  }

 private:
  MPI_Request req_;
  std::string group_;
  std::chrono::milliseconds timeout_;
  bool done_ = false;
};

class MpiCommunicator final : public Communicator {
 public:
  // Takes ownership of comm (freed in the destructor).
  MpiCommunicator(MPI_Comm comm, std::string name) : comm_(comm), name_(std::move(name)) {
    // Errors come back as return codes so that they become xmoe::Error naming the collective and group.
    check_mpi(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler", "communicator",
              name_);
    check_mpi(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank", "communicator", name_);
    check_mpi(MPI_Comm_size(comm_, &size_), "MPI_Comm_size", "communicator", name_);
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);  // after MPI_Finalize the handle is gone with the rest of MPI
  }
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return name_; }

  void all_to_all(const void* send, void* recv, size_t count, ElementType type) override {
    MPI_Request req = start_all_to_all(send, recv, count, type, "all_to_all");
    complete(&req, "all_to_all");
  }
  std::unique_ptr<CommRequest> all_to_all_async(const void* send, void* recv, size_t count,
                                                ElementType type) override {
    MPI_Request req = start_all_to_all(send, recv, count, type, "all_to_all_async");
    return std::make_unique<MpiRequest>(req, name_, timeout());
  }

  void all_to_all_v(const void* send, std::span<const int64_t> send_counts,
                    std::span<const int64_t> send_displs, void* recv, std::span<const int64_t> recv_counts,
                    std::span<const int64_t> recv_displs, ElementType type) override {
    const char* what = "all_to_all_v";
    dist::check_counts(send_counts, send_displs, size_, "send_counts", "send_displs", what, name_);
    dist::check_counts(recv_counts, recv_displs, size_, "recv_counts", "recv_displs", what, name_);
    XMOE_CHECK(!send_displs.empty() && !recv_displs.empty(), what, " on group '", name_,
               "': send_displs and recv_displs need one entry per rank");
    XMOE_CHECK(send != recv, what, " on group '", name_,
               "': send and recv are the same buffer; only all_reduce runs in place");
    std::vector<int> sc(static_cast<size_t>(size_)), sd(sc.size()), rc(sc.size()), rd(sc.size());
    for (size_t r = 0; r < sc.size(); ++r) {
      sc[r] = to_int(static_cast<uint64_t>(send_counts[r]), "send_counts[r]", what, name_);
      sd[r] = to_int(static_cast<uint64_t>(send_displs[r]), "send_displs[r]", what, name_);
      rc[r] = to_int(static_cast<uint64_t>(recv_counts[r]), "recv_counts[r]", what, name_);
      rd[r] = to_int(static_cast<uint64_t>(recv_displs[r]), "recv_displs[r]", what, name_);
    }
    const MPI_Datatype t = mpi_type(type);
    MPI_Request req;
    check_mpi(MPI_Ialltoallv(send, sc.data(), sd.data(), t, recv, rc.data(), rd.data(), t, comm_, &req),
              "MPI_Ialltoallv", what, name_);
    complete(&req, what);  // the int arrays must stay alive until completion
  }

  void all_gather(const void* send, void* recv, size_t count, ElementType type) override {
    const char* what = "all_gather";
    const int n = to_int(count, "count", what, name_);
    dist::check_not_in_place(send, recv, count, what, name_);
    const MPI_Datatype t = mpi_type(type);
    MPI_Request req;
    check_mpi(MPI_Iallgather(send, n, t, recv, n, t, comm_, &req), "MPI_Iallgather", what, name_);
    complete(&req, what);
  }

  void all_gather_v(const void* send, size_t count, void* recv, std::span<const int64_t> recv_counts,
                    ElementType type) override {
    const char* what = "all_gather_v";
    dist::check_counts(recv_counts, {}, size_, "recv_counts", "", what, name_);
    XMOE_CHECK(static_cast<int64_t>(count) == recv_counts[static_cast<size_t>(rank_)], what, " on group '",
               name_, "': rank ", rank_, " sends ", count, " elements but recv_counts[", rank_,
               "] = ", recv_counts[static_cast<size_t>(rank_)]);
    dist::check_not_in_place(send, recv, count, what, name_);
    std::vector<int> rc(static_cast<size_t>(size_)), rd(rc.size());
    uint64_t offset = 0;
    for (size_t r = 0; r < rc.size(); ++r) {
      rc[r] = to_int(static_cast<uint64_t>(recv_counts[r]), "recv_counts[r]", what, name_);
      rd[r] = to_int(offset, "the displacement of a block", what, name_);
      offset += static_cast<uint64_t>(recv_counts[r]);
    }
    const MPI_Datatype t = mpi_type(type);
    MPI_Request req;
    check_mpi(MPI_Iallgatherv(send, to_int(count, "count", what, name_), t, recv, rc.data(), rd.data(), t,
                              comm_, &req),
              "MPI_Iallgatherv", what, name_);
    complete(&req, what);
  }

  void all_reduce(const void* send, void* recv, size_t count, ElementType type, ReduceOp op) override {
    const char* what = "all_reduce";
    dist::check_reducible(type, what, name_);
    const int n = to_int(count, "count", what, name_);
    MPI_Request req;
    check_mpi(
        MPI_Iallreduce(send == recv ? MPI_IN_PLACE : send, recv, n, mpi_type(type), mpi_op(op), comm_, &req),
        "MPI_Iallreduce", what, name_);
    complete(&req, what);
  }

  void reduce_scatter(const void* send, void* recv, size_t recv_count, ElementType type,
                      ReduceOp op) override {
    const char* what = "reduce_scatter";
    dist::check_reducible(type, what, name_);
    const int n = to_int(recv_count, "recv_count", what, name_);
    dist::check_not_in_place(send, recv, recv_count, what, name_);
    MPI_Request req;
    check_mpi(MPI_Ireduce_scatter_block(send, recv, n, mpi_type(type), mpi_op(op), comm_, &req),
              "MPI_Ireduce_scatter_block", what, name_);
    complete(&req, what);
  }

  void broadcast(void* data, size_t count, ElementType type, int root) override {
    const char* what = "broadcast";
    dist::check_root(root, size_, what, name_);
    MPI_Request req;
    check_mpi(MPI_Ibcast(data, to_int(count, "count", what, name_), mpi_type(type), root, comm_, &req),
              "MPI_Ibcast", what, name_);
    complete(&req, what);
  }

  void barrier() override {
    MPI_Request req;
    check_mpi(MPI_Ibarrier(comm_, &req), "MPI_Ibarrier", "barrier", name_);
    complete(&req, "barrier");
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    const char* what = "split";
    XMOE_CHECK(color >= 0, what, " of group '", name_, "': color must be >= 0, got ", color);
    // MPI has no non-blocking MPI_Comm_split: a bounded barrier first makes sure every rank has arrived, so
    // the blocking split that follows cannot hang on a missing peer.
    MPI_Request req;
    check_mpi(MPI_Ibarrier(comm_, &req), "MPI_Ibarrier", what, name_);
    complete(&req, what);
    MPI_Comm sub = MPI_COMM_NULL;
    check_mpi(MPI_Comm_split(comm_, color, key, &sub), "MPI_Comm_split", what, name_);
    auto c = std::make_unique<MpiCommunicator>(sub, detail::concat(name_, "/split(color=", color, ")"));
    c->set_timeout(timeout());
    return c;
  }

 private:
  MPI_Request start_all_to_all(const void* send, void* recv, size_t count, ElementType type,
                               const char* what) {
    const int n = to_int(count, "count", what, name_);
    dist::check_not_in_place(send, recv, count, what, name_);
    const MPI_Datatype t = mpi_type(type);
    MPI_Request req;
    check_mpi(MPI_Ialltoall(send, n, t, recv, n, t, comm_, &req), "MPI_Ialltoall", what, name_);
    return req;
  }

  void complete(MPI_Request* req, const char* what) { wait_bounded(req, comm_, what, name_, timeout()); }

  MPI_Comm comm_;
  std::string name_;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace

MpiSession::MpiSession() : MpiSession(nullptr, nullptr) {}

MpiSession::MpiSession(int* argc, char*** argv) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  XMOE_CHECK(!finalized,
             "MpiSession: MPI was already finalized in this process (MPI starts once per process)");
  int provided = MPI_THREAD_SINGLE;
  if (!initialized) {
    XMOE_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) == MPI_SUCCESS,
               "MpiSession: MPI_Init_thread failed");
    owns_mpi_ = true;
  } else {
    MPI_Query_thread(&provided);
  }
  XMOE_CHECK(provided >= MPI_THREAD_FUNNELED, "MpiSession: the MPI library provides thread level ", provided,
             ", xmoe needs MPI_THREAD_FUNNELED (OpenMP threads run between MPI calls)");
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size_);
}

MpiSession::~MpiSession() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owns_mpi_ && !finalized) MPI_Finalize();
}

std::unique_ptr<Communicator> MpiSession::world() {
  // The duplicate gets its own message space; MPI_Comm_idup keeps even this first step bounded.
  MPI_Comm dup = MPI_COMM_NULL;
  MPI_Request req;
  XMOE_CHECK(MPI_Comm_idup(MPI_COMM_WORLD, &dup, &req) == MPI_SUCCESS,
             "MpiSession::world: MPI_Comm_idup of MPI_COMM_WORLD failed");
  wait_bounded(&req, MPI_COMM_WORLD, "world (MPI_Comm_idup)", "MPI_COMM_WORLD", comm_timeout_from_env());
  return std::make_unique<MpiCommunicator>(dup, "world");
}

}  // namespace xmoe
