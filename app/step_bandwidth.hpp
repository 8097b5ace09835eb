// Decode steps against a read probe run between them (kernels::ReadProbe): on a shared host the read
// bandwidth moves between levels within seconds, so each step is compared with the probes right beside it
// rather than with probes before and after the whole run.
#pragma once
#include <vector>

namespace xmoe::app {

struct DecodeStepSample {
  double bytes = 0;      // weights the step read
  double seconds = 0;    // the step's time
  double probe_gbs = 0;  // the higher of the probes right before and right after the step
};

struct StepBandwidth {
  int steps = 0;
  double probe_min = 0, probe_median = 0, probe_max = 0;  // GB/s
  // The run's share of the roofline at those probes: Σ bytes / probe (each step's time were it bound by
  // reading its bytes at the rate probed beside it) over Σ seconds. At batch 1 it is the share of the read
  // bandwidth.
  double share = 0;
  // Each step's own share (bytes / seconds / probe): median and quartiles.
  double share_median = 0, share_low = 0, share_high = 0;
};

// Zero steps give a summary of zeros; samples with no time or no probe are skipped.
StepBandwidth summarize_steps(const std::vector<DecodeStepSample>& samples);

}  // namespace xmoe::app
