// Anonymous memory in 2 MiB pages where the kernel has them (transparent huge pages, advised before the first
// touch): a stream over it walks one page-table entry per 2 MiB, as over a checkpoint in 2 MiB page-cache
// pages (io/page_cache.hpp). On a 2-vCPU Sapphire Rapids VM the read probe streamed 25.6-26.0 GB/s in 4 KiB
// pages and 32.9-34.4 GB/s in 2 MiB ones.
#pragma once
#include <cstddef>
#include <cstdlib>
#include <memory>

namespace xmoe {

struct FreeBytes {
  void operator()(std::byte* p) const { std::free(p); }
};
using HugeBuffer = std::unique_ptr<std::byte[], FreeBytes>;

inline constexpr size_t kHugePageSize = size_t{2} << 20;

// At least `bytes` (rounded up to whole 2 MiB pages), 2 MiB-aligned, advised MADV_HUGEPAGE (4 KiB pages where
// the kernel refuses). Throws std::bad_alloc.
HugeBuffer allocate_huge_buffer(size_t bytes);

struct UnmapBytes {
  size_t bytes = 0;
  void operator()(std::byte* p) const;
};
using ZeroedHugeBuffer = std::unique_ptr<std::byte[], UnmapBytes>;

// The same in an anonymous mapping: zero-filled, and costing address space, not memory, until a page is first
// written (each then a 2 MiB page where the kernel has one), for a large budget used from its start.
// Throws std::bad_alloc.
ZeroedHugeBuffer allocate_zeroed_huge_buffer(size_t bytes);

}  // namespace xmoe
