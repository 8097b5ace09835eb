// How the xmoe command's OpenMP threads wait between parallel regions.
#pragma once

#include <string>

namespace xmoe::app {

// The spin count xmoe gives libgomp when the environment names no wait policy.
inline constexpr const char* kDefaultGompSpinCount = "10000";

// Unless OMP_WAIT_POLICY or GOMP_SPINCOUNT is set, sets GOMP_SPINCOUNT to the default and executes this
// program again with the same arguments (libgomp reads its environment once, before main); returns only when
// the environment already chose, or when the exec failed (then libgomp's own default stays). Call first in
// main.
void use_default_openmp_wait(char** argv);

// The policy in force, for `xmoe info` and the benchmarks' reports.
std::string openmp_wait_description();

}  // namespace xmoe::app
