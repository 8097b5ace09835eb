// Collective communication for expert parallelism. Backends: a single-process one (size 1) and MPI
// (xmoe/mpi.hpp); an NCCL backend plugs in behind the same interface later. Every wait is bounded by a
// timeout: a rank that never arrives makes the others fail with a message naming the rank, the collective and
// the group.
//
// Threading: a communicator is used by one thread at a time (the MPI backend runs at MPI_THREAD_FUNNELED, so
// that thread must be the one that created the MpiSession).
// Buffers: send and recv must not overlap, except all_reduce, which may run in place (send == recv).
#pragma once
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "xmoe/dtype.hpp"

namespace xmoe {

enum class ReduceOp { sum, max, min };
// bf16 moves as 2-byte words; reductions on it are an error (no backend reduces bf16 exactly the same way).
enum class ElementType { f32, f64, bf16, i32, i64, u8 };
size_t element_size(ElementType t);
const char* element_type_name(ElementType t);  // "f32", "f64", "bf16", "i32", "i64", "u8"
const char* reduce_op_name(ReduceOp op);       // "sum", "max", "min"

// The collective timeout a new communicator starts with: env XMOE_COMM_TIMEOUT_S (seconds, > 0, fractions
// allowed), 300 s when unset. Throws xmoe::Error naming the variable when it is not a positive number.
std::chrono::milliseconds comm_timeout_from_env();

// A pending non-blocking collective. wait() blocks until done; the wait is bounded by the issuing
// communicator's timeout, counted from the call to wait() (time spent computing between issue and wait is
// not a hang). The buffers must stay alive until wait() returns or test() reports true. Destroying a request
// that has not completed waits for it first.
class CommRequest {
 public:
  virtual ~CommRequest() = default;
  virtual void wait() = 0;
  virtual bool test() = 0;  // true once complete
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;  // e.g. "world", "world/split(color=1)"

  // Equal blocks: send holds size() blocks of `count` elements, block r goes to rank r; recv likewise by
  // source.
  virtual void all_to_all(const void* send, void* recv, size_t count, ElementType type) = 0;
  virtual std::unique_ptr<CommRequest> all_to_all_async(const void* send, void* recv, size_t count,
                                                        ElementType type) = 0;
  // Variable blocks: counts and displacements in elements, one per rank (each span has size() entries).
  virtual void all_to_all_v(const void* send, std::span<const int64_t> send_counts,
                            std::span<const int64_t> send_displs, void* recv,
                            std::span<const int64_t> recv_counts, std::span<const int64_t> recv_displs,
                            ElementType type) = 0;
  // recv holds size() blocks of `count` elements, block r from rank r.
  virtual void all_gather(const void* send, void* recv, size_t count, ElementType type) = 0;
  // recv_counts[r] elements from rank r, placed back to back in rank order; count == recv_counts[rank()].
  virtual void all_gather_v(const void* send, size_t count, void* recv, std::span<const int64_t> recv_counts,
                            ElementType type) = 0;
  virtual void all_reduce(const void* send, void* recv, size_t count, ElementType type, ReduceOp op) = 0;
  // send holds size() blocks of recv_count elements; rank r receives the reduction of every rank's block r.
  virtual void reduce_scatter(const void* send, void* recv, size_t recv_count, ElementType type,
                              ReduceOp op) = 0;
  virtual void broadcast(void* data, size_t count, ElementType type, int root) = 0;
  virtual void barrier() = 0;

  // Ranks with the same color (>= 0) form a sub-group, ordered by key (then by rank). Collective over this
  // group. The new communicator inherits this one's timeout.
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;

  std::chrono::milliseconds timeout() const { return timeout_; }
  void set_timeout(std::chrono::milliseconds t) { timeout_ = t; }

 protected:
  Communicator() : timeout_(comm_timeout_from_env()) {}

  std::chrono::milliseconds timeout_;
};

// The size-1 communicator: every collective is a copy. Named "local".
std::unique_ptr<Communicator> make_local_communicator();

// LOCAL_SIZE (ranks per node) from the environment; throws xmoe::Error naming LOCAL_SIZE when it is unset or
// not a positive integer.
int local_size_from_env();

// Tutel's 2DH all-to-all: the same result as world.all_to_all, done in two phases so that inter-node traffic
// is one large message per node pair instead of local_size² small ones. Nodes are consecutive blocks of
// local_size ranks (world rank r = node · local_size + local index).
//   1. stride-copy send blocks into (dest local index, dest node) order;
//   2. all-to-all inside the node (count · nodes elements per peer);
//   3. stride-copy into (dest node, source local index) order;
//   4. all-to-all among the ranks with the same local index (count · local_size elements per peer), which
//      lands every block at its destination in source-rank order.
// Built once (collective over world: it splits world into the intra- and inter-node groups); the scratch
// buffers grow to the largest message and are reused. With one node or local_size 1 it runs the flat
// all-to-all. `world` must outlive this object.
class HierarchicalAllToAll {
 public:
  // local_size <= 0 reads LOCAL_SIZE from the environment. world.size() % local_size must be 0.
  HierarchicalAllToAll(Communicator& world, int local_size);

  void run(const void* send, void* recv, size_t count, ElementType type);

  int local_size() const { return local_size_; }
  int num_nodes() const { return num_nodes_; }
  bool is_flat() const { return !intra_; }  // true when it just calls world.all_to_all

 private:
  Communicator& world_;
  int local_size_;
  int num_nodes_;
  std::unique_ptr<Communicator> intra_;  // the ranks of this node, ordered by local index
  std::unique_ptr<Communicator> inter_;  // the ranks with this local index, ordered by node
  std::vector<std::byte> stage_a_, stage_b_;
};

}  // namespace xmoe
