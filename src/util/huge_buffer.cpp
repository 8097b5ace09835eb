#include "util/huge_buffer.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <new>

namespace xmoe {

HugeBuffer allocate_huge_buffer(size_t bytes) {
  const size_t rounded = (std::max<size_t>(bytes, 1) + kHugePageSize - 1) / kHugePageSize * kHugePageSize;
  HugeBuffer buffer(static_cast<std::byte*>(std::aligned_alloc(kHugePageSize, rounded)));
  if (!buffer) throw std::bad_alloc();
  (void)::madvise(buffer.get(), rounded, MADV_HUGEPAGE);  // refused without transparent huge pages
  return buffer;
}

}  // namespace xmoe
