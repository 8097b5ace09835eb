// The single-process communicator: with one rank every collective moves data from send to recv unchanged
// (a reduction over one contributor is that contributor). Arguments are checked as the MPI backend checks
// them (bar MPI's int count limit), so code tested with size 1 does not start failing at size > 1.
#include <cstring>

#include "dist/checks.hpp"
#include "xmoe/communicator.hpp"
#include "xmoe/error.hpp"

namespace xmoe {

namespace {

class DoneRequest final : public CommRequest {
 public:
  void wait() override {}
  bool test() override { return true; }
};

class LocalCommunicator final : public Communicator {
 public:
  explicit LocalCommunicator(std::string name) : name_(std::move(name)) {}

  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return name_; }

  void all_to_all(const void* send, void* recv, size_t count, ElementType type) override {
    copy(send, recv, count, type, "all_to_all");
  }
  std::unique_ptr<CommRequest> all_to_all_async(const void* send, void* recv, size_t count,
                                                ElementType type) override {
    copy(send, recv, count, type, "all_to_all_async");
    return std::make_unique<DoneRequest>();
  }
  void all_to_all_v(const void* send, std::span<const int64_t> send_counts,
                    std::span<const int64_t> send_displs, void* recv, std::span<const int64_t> recv_counts,
                    std::span<const int64_t> recv_displs, ElementType type) override {
    dist::check_counts(send_counts, send_displs, 1, "send_counts", "send_displs", "all_to_all_v", name_);
    dist::check_counts(recv_counts, recv_displs, 1, "recv_counts", "recv_displs", "all_to_all_v", name_);
    XMOE_CHECK(send_displs.size() == 1 && recv_displs.size() == 1, "all_to_all_v on group '", name_,
               "': send_displs and recv_displs need one entry per rank");
    XMOE_CHECK(send_counts[0] == recv_counts[0], "all_to_all_v on group '", name_, "': rank 0 sends ",
               send_counts[0], " elements to itself but expects ", recv_counts[0]);
    const size_t es = element_size(type);
    copy(static_cast<const std::byte*>(send) + static_cast<size_t>(send_displs[0]) * es,
         static_cast<std::byte*>(recv) + static_cast<size_t>(recv_displs[0]) * es,
         static_cast<size_t>(send_counts[0]), type, "all_to_all_v");
  }
  void all_gather(const void* send, void* recv, size_t count, ElementType type) override {
    copy(send, recv, count, type, "all_gather");
  }
  void all_gather_v(const void* send, size_t count, void* recv, std::span<const int64_t> recv_counts,
                    ElementType type) override {
    dist::check_counts(recv_counts, {}, 1, "recv_counts", "", "all_gather_v", name_);
    XMOE_CHECK(static_cast<int64_t>(count) == recv_counts[0], "all_gather_v on group '", name_,
               "': rank 0 sends ", count, " elements but recv_counts[0] = ", recv_counts[0]);
    copy(send, recv, count, type, "all_gather_v");
  }
  void all_reduce(const void* send, void* recv, size_t count, ElementType type, ReduceOp) override {
    dist::check_reducible(type, "all_reduce", name_);
    if (send != recv) std::memcpy(recv, send, count * element_size(type));
  }
  void reduce_scatter(const void* send, void* recv, size_t recv_count, ElementType type, ReduceOp) override {
    dist::check_reducible(type, "reduce_scatter", name_);
    copy(send, recv, recv_count, type, "reduce_scatter");
  }
  void broadcast(void*, size_t, ElementType, int root) override {
    dist::check_root(root, 1, "broadcast", name_);  // the data already is where it goes
  }
  void barrier() override {}

  std::unique_ptr<Communicator> split(int color, int) override {
    XMOE_CHECK(color >= 0, "split of group '", name_, "': color must be >= 0, got ", color);
    auto c = std::make_unique<LocalCommunicator>(detail::concat(name_, "/split(color=", color, ")"));
    c->set_timeout(timeout());
    return c;
  }

 private:
  void copy(const void* send, void* recv, size_t count, ElementType type, const char* what) const {
    const size_t bytes = count * element_size(type);
    dist::check_not_in_place(send, recv, bytes, what, name_);
    if (bytes) std::memcpy(recv, send, bytes);
  }

  std::string name_;
};

}  // namespace

std::unique_ptr<Communicator> make_local_communicator() {
  return std::make_unique<LocalCommunicator>("local");
}

}  // namespace xmoe
