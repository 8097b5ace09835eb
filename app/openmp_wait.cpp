// A bounded spin before OpenMP's threads sleep, unless the environment chooses a policy.
//
// Why: a batch-1 decode step of the 8-layer Qwen3-30B-A3B shape opens ~42 parallel regions, microseconds
// apart. A sleeping (passive) worker takes 30-60 us to wake on a virtual machine: ~2 ms of a 50 ms step.
// libgomp's own default (a 300000-iteration spin, milliseconds) wastes whole time slices when other processes
// want the cores (a tiny model decoded 100x slower at load 14). 10000 iterations (0.1-0.5 ms on the CPUs
// seen) cover the gaps between a step's regions and bound what a loaded machine loses.
//
// libgomp reads its environment in its initialiser, which runs after the C library's (which resets the
// environment an executable's .preinit_array could have changed) and before main: only a fresh exec can give
// it another value.
#include "openmp_wait.hpp"

#include <unistd.h>

#include <cstdlib>

namespace xmoe::app {

void use_default_openmp_wait(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr) return;
  if (setenv("GOMP_SPINCOUNT", kDefaultGompSpinCount, 0) != 0) return;
  execv("/proc/self/exe", argv);
  unsetenv("GOMP_SPINCOUNT");  // not executed again: this process's libgomp keeps its own default
}

std::string openmp_wait_description() {
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  const char* spin = std::getenv("GOMP_SPINCOUNT");
  if (policy == nullptr && spin == nullptr) return "libgomp's default";
  std::string s;
  if (policy) s += std::string("OMP_WAIT_POLICY=") + policy;
  if (spin) s += std::string(s.empty() ? "" : " ") + "GOMP_SPINCOUNT=" + spin;
  if (policy == nullptr && std::string(spin) == kDefaultGompSpinCount)
    s += " (xmoe's default: spin, then sleep)";
  return s;
}

}  // namespace xmoe::app
