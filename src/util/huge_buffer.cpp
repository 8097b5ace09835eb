#include "util/huge_buffer.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <new>

namespace xmoe {

HugeBuffer allocate_huge_buffer(size_t bytes) {
  const size_t rounded = (std::max<size_t>(bytes, 1) + kHugePageSize - 1) / kHugePageSize * kHugePageSize;
  HugeBuffer buffer(static_cast<std::byte*>(std::aligned_alloc(kHugePageSize, rounded)));
  if (!buffer) throw std::bad_alloc();
  (void)::madvise(buffer.get(), rounded, MADV_HUGEPAGE);  // refused without transparent huge pages
  return buffer;
}

void UnmapBytes::operator()(std::byte* p) const {
  if (p) ::munmap(p, bytes);
}

ZeroedHugeBuffer allocate_zeroed_huge_buffer(size_t bytes) {
  const size_t rounded = (std::max<size_t>(bytes, 1) + kHugePageSize - 1) / kHugePageSize * kHugePageSize;
  // One huge page more than asked, then the ends trimmed so the rest starts on a 2 MiB boundary (a huge page
  // maps only an aligned 2 MiB range).
  const size_t mapped = rounded + kHugePageSize;
  void* base =
      ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) throw std::bad_alloc();
  const auto at = reinterpret_cast<uintptr_t>(base);
  const uintptr_t start = (at + kHugePageSize - 1) / kHugePageSize * kHugePageSize;
  if (start > at) ::munmap(base, start - at);
  if (at + mapped > start + rounded)
    ::munmap(reinterpret_cast<void*>(start + rounded), at + mapped - start - rounded);
  auto* p = reinterpret_cast<std::byte*>(start);
  (void)::madvise(p, rounded, MADV_HUGEPAGE);  // refused without transparent huge pages
  return ZeroedHugeBuffer(p, UnmapBytes{rounded});
}

}  // namespace xmoe
