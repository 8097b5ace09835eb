#include "step_bandwidth.hpp"

#include <algorithm>

#include "stats.hpp"

namespace xmoe::app {

StepBandwidth summarize_steps(const std::vector<DecodeStepSample>& samples) {
  StepBandwidth out;
  std::vector<double> probes, shares;
  double roof_seconds = 0, seconds = 0;
  for (const DecodeStepSample& s : samples) {
    if (s.seconds <= 0 || s.probe_gbs <= 0) continue;
    const double roof = s.bytes / (s.probe_gbs * 1e9);
    roof_seconds += roof;
    seconds += s.seconds;
    probes.push_back(s.probe_gbs);
    shares.push_back(roof / s.seconds);
  }
  out.steps = static_cast<int>(shares.size());
  if (shares.empty()) return out;
  std::sort(probes.begin(), probes.end());
  std::sort(shares.begin(), shares.end());
  const size_t n = shares.size();
  out.probe_min = probes.front();
  out.probe_max = probes.back();
  out.probe_median = median(probes);
  out.share = roof_seconds / seconds;
  out.share_median = median(shares);
  out.share_low = shares[(n - 1) / 4];
  out.share_high = shares[n - 1 - (n - 1) / 4];
  return out;
}

}  // namespace xmoe::app
