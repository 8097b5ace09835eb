// This process's resident memory, from /proc/self/status: anonymous pages (our own buffers) apart from
// file-backed ones (the mapped checkpoint, which is the page cache and not a second copy).
#pragma once
#include <cstddef>

namespace xmoe::app {

struct ResidentMemory {
  size_t total = 0, anonymous = 0, file = 0;  // bytes (VmRSS, RssAnon, RssFile); 0 where unavailable
};
ResidentMemory resident_memory();

}  // namespace xmoe::app
