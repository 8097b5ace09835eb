// `xmoe linear-bench --model DIR`: where one batch-1 decode step of a Qwen3-MoE-shaped checkpoint spends its
// time and bytes. The weight-reading ops of a step (attention projections, router, routed experts, lm_head)
// run through the same kernels and expert schedule the model uses, over the checkpoint's own mapped weights,
// layer after layer as a step runs them; each class's time, bytes and GB/s are set against the read probe of
// the same run, and the probe's anonymous buffer against the same read over the mapped checkpoint file.
#pragma once
#include <string>

#include "kernels/kernels.hpp"

namespace xmoe::app {

struct DecodeProfileOptions {
  std::string model;              // checkpoint directory
  int steps = 7;                  // timed steps (medians), after one warm-up step
  std::string madvise = "none";   // none | hugepage | sequential | willneed: on the weights
  bool thread_clock = false;      // the calling thread's CPU time (one thread) instead of wall time
  bool compare_anonymous = true;  // also time lm_head and the experts over anonymous copies
};

int run_decode_profile(const kernels::KernelTable& table, const DecodeProfileOptions& o);

}  // namespace xmoe::app
