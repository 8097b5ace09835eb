// Argument checks shared by the communicator backends, so that a bad call fails the same way (same message,
// before any communication) whatever the backend and the group size.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "xmoe/communicator.hpp"
#include "xmoe/error.hpp"

namespace xmoe::dist {

// One count and one displacement per rank, none negative.
inline void check_counts(std::span<const int64_t> counts, std::span<const int64_t> displs, int size,
                         const char* counts_name, const char* displs_name, const char* what,
                         const std::string& group) {
  XMOE_CHECK(counts.size() == static_cast<size_t>(size), what, " on group '", group, "': ", counts_name,
             " has ", counts.size(), " entries, expected ", size, " (one per rank)");
  XMOE_CHECK(displs.empty() || displs.size() == static_cast<size_t>(size), what, " on group '", group,
             "': ", displs_name, " has ", displs.size(), " entries, expected ", size, " (one per rank)");
  for (size_t r = 0; r < counts.size(); ++r) {
    XMOE_CHECK(counts[r] >= 0, what, " on group '", group, "': ", counts_name, "[", r, "] = ", counts[r],
               " is negative");
    if (!displs.empty())
      XMOE_CHECK(displs[r] >= 0, what, " on group '", group, "': ", displs_name, "[", r, "] = ", displs[r],
                 " is negative");
  }
}

// Reductions are defined on the arithmetic types; bf16 only moves (see ElementType).
inline void check_reducible(ElementType type, const char* what, const std::string& group) {
  XMOE_CHECK(type != ElementType::bf16, what, " on group '", group,
             "': reductions on bf16 are not supported (bf16 only moves); reduce in f32");
}

inline void check_root(int root, int size, const char* what, const std::string& group) {
  XMOE_CHECK(root >= 0 && root < size, what, " on group '", group, "': root ", root, " is outside [0, ", size,
             ")");
}

inline void check_not_in_place(const void* send, const void* recv, size_t bytes, const char* what,
                               const std::string& group) {
  XMOE_CHECK(bytes == 0 || send != recv, what, " on group '", group,
             "': send and recv are the same buffer; only all_reduce runs in place");
}

}  // namespace xmoe::dist
