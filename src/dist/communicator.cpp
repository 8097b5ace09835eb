// Backend-independent parts of the communication layer: element types, environment settings and the 2DH
// (hierarchical) all-to-all built on any Communicator.
#include "xmoe/communicator.hpp"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "xmoe/error.hpp"

namespace xmoe {

size_t element_size(ElementType t) {
  switch (t) {
    case ElementType::f32:
      return 4;
    case ElementType::f64:
      return 8;
    case ElementType::bf16:
      return 2;
    case ElementType::i32:
      return 4;
    case ElementType::i64:
      return 8;
    case ElementType::u8:
      return 1;
  }
  throw Error(detail::concat("element_size: unknown ElementType ", static_cast<int>(t)));
}

const char* element_type_name(ElementType t) {
  switch (t) {
    case ElementType::f32:
      return "f32";
    case ElementType::f64:
      return "f64";
    case ElementType::bf16:
      return "bf16";
    case ElementType::i32:
      return "i32";
    case ElementType::i64:
      return "i64";
    case ElementType::u8:
      return "u8";
  }
  return "unknown";
}

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::max:
      return "max";
    case ReduceOp::min:
      return "min";
  }
  return "unknown";
}

std::chrono::milliseconds comm_timeout_from_env() {
  const char* s = std::getenv("XMOE_COMM_TIMEOUT_S");
  if (!s || !*s) return std::chrono::minutes(5);
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(s, &end);
  XMOE_CHECK(errno == 0 && end && *end == '\0' && std::isfinite(v) && v > 0 && v < 1e9,
             "XMOE_COMM_TIMEOUT_S: must be a positive number of seconds, got '", s, "'");
  // Round up so that a tiny positive value never becomes a zero (immediately expiring) timeout.
  return std::chrono::milliseconds(static_cast<int64_t>(std::ceil(v * 1000.0)));
}

int local_size_from_env() {
  const char* s = std::getenv("LOCAL_SIZE");
  XMOE_CHECK(s && *s, "LOCAL_SIZE: not set; set it to the number of ranks per node (or pass local_size)");
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(s, &end, 10);
  XMOE_CHECK(errno == 0 && end && *end == '\0' && v > 0 && v <= std::numeric_limits<int>::max(),
             "LOCAL_SIZE: must be a positive integer (ranks per node), got '", s, "'");
  return static_cast<int>(v);
}

HierarchicalAllToAll::HierarchicalAllToAll(Communicator& world, int local_size)
    : world_(world), local_size_(local_size > 0 ? local_size : local_size_from_env()) {
  const int w = world.size();
  XMOE_CHECK(local_size_ <= w && w % local_size_ == 0, "HierarchicalAllToAll: LOCAL_SIZE=", local_size_,
             " does not divide the size ", w, " of group '", world.name(),
             "' (nodes are consecutive blocks of LOCAL_SIZE ranks)");
  num_nodes_ = w / local_size_;
  if (num_nodes_ == 1 || local_size_ == 1)
    return;  // one phase would be empty: the flat a2a is the same thing
  const int node = world.rank() / local_size_, local = world.rank() % local_size_;
  intra_ = world.split(node, local);
  inter_ = world.split(local, node);
  XMOE_CHECK(intra_->size() == local_size_ && inter_->size() == num_nodes_,
             "HierarchicalAllToAll: split of group '", world.name(), "' gave groups of ", intra_->size(),
             " and ", inter_->size(), " ranks, expected ", local_size_, " and ", num_nodes_);
}

void HierarchicalAllToAll::run(const void* send, void* recv, size_t count, ElementType type) {
  if (is_flat()) {
    world_.all_to_all(send, recv, count, type);
    return;
  }
  const size_t g_n = static_cast<size_t>(local_size_), n_n = static_cast<size_t>(num_nodes_);
  const size_t block = count * element_size(type);
  XMOE_CHECK(count == 0 || block / count == element_size(type), "hierarchical all_to_all on group '",
             world_.name(), "': count ", count, " overflows the byte size");
  const size_t total = block * g_n * n_n;
  XMOE_CHECK(block == 0 || total / block == g_n * n_n, "hierarchical all_to_all on group '", world_.name(),
             "': count ", count, " overflows the byte size");
  if (stage_a_.size() < total) stage_a_.resize(total);
  if (stage_b_.size() < total) stage_b_.resize(total);
  const auto* in = static_cast<const std::byte*>(send);
  std::byte* a = stage_a_.data();
  std::byte* b = stage_b_.data();
  // 1. Block for world rank (node n, local g) moves to slot (g, n): each local peer's share becomes
  // contiguous.
  for (size_t g = 0; g < g_n; ++g)
    for (size_t n = 0; n < n_n; ++n)
      std::memcpy(a + (g * n_n + n) * block, in + (n * g_n + g) * block, block);
  // 2. After this, b slot (src local s, dest node n) holds what (this node, s) sends to (n, this local
  // index).
  intra_->all_to_all(a, b, count * n_n, type);
  // 3. Regroup by destination node so that each inter-node peer's share is contiguous: slot (n, s).
  for (size_t s = 0; s < g_n; ++s)
    for (size_t n = 0; n < n_n; ++n) std::memcpy(a + (n * g_n + s) * block, b + (s * n_n + n) * block, block);
  // 4. Peer node m sends its slots (this node, s) for every s: they land at (m, s) = source world rank m·G +
  // s.
  inter_->all_to_all(a, recv, count * g_n, type);
}

}  // namespace xmoe
