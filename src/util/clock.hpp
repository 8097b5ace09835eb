// Seconds on the clocks benchmarks and profiles read: wall time, and a thread's or the process's CPU time (on
// a loaded machine the time code actually ran, not the time it waited for a core).
#pragma once
#include <time.h>

#include <chrono>

namespace xmoe {

inline double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// CLOCK_THREAD_CPUTIME_ID or CLOCK_PROCESS_CPUTIME_ID.
inline double cpu_seconds(clockid_t clock) {
  timespec t{};
  clock_gettime(clock, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

}  // namespace xmoe
