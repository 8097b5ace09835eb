// The server's counters in Prometheus' text exposition format (version 0.0.4), written by hand: requests by
// route and status, prompt and generated tokens, time-to-first-token and inter-token latency histograms, and
// the engine's gauges (queue depth, running sequences, KV-cache blocks). Thread-safe.
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace xmoe::serve {

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double value);
  // "name_bucket{le=...} n" lines (cumulative, ending with +Inf), then name_sum and name_count.
  void render(const std::string& name, std::string& out) const;

 private:
  std::vector<double> bounds_;
  std::vector<int64_t> counts_;  // per bucket, not cumulative; the last is +Inf
  double sum_ = 0;
  int64_t count_ = 0;
};

struct EngineGauges {
  int64_t queue_depth = 0;   // sequences submitted and not yet running
  int64_t running = 0;       // sequences in the batch
  int64_t running_peak = 0;  // the most sequences in the batch at once since the server started
  int64_t kv_blocks_used = 0, kv_blocks_total = 0;
};

class ServerMetrics {
 public:
  ServerMetrics();
  void count_request(const std::string& route, int status);
  void count_prompt_tokens(int64_t n);
  void count_generated_tokens(int64_t n);
  void count_cancelled();
  void observe_time_to_first_token(double seconds);
  void observe_inter_token_latency(double seconds);
  std::string render(const EngineGauges& gauges) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, int64_t> requests_;
  int64_t prompt_tokens_ = 0, generated_tokens_ = 0, cancelled_ = 0;
  Histogram ttft_, itl_;
};

}  // namespace xmoe::serve
