#include "serve/metrics.hpp"

#include <algorithm>
#include <cstdio>

namespace xmoe::serve {

namespace {

std::string number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

// Label values escape backslash, double quote and newline.
std::string label_value(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

void header(std::string& out, const char* name, const char* type, const char* help) {
  out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

void sample(std::string& out, const char* name, double value) {
  out += std::string(name) + " " + number(value) + "\n";
}

}  // namespace

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  const size_t bucket =
      static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin());
  ++counts_[bucket];
  sum_ += value;
  ++count_;
}

void Histogram::render(const std::string& name, std::string& out) const {
  int64_t cumulative = 0;
  for (size_t i = 0; i < counts_.size(); ++i) {
    cumulative += counts_[i];
    const std::string le = i < bounds_.size() ? number(bounds_[i]) : "+Inf";
    out += name + "_bucket{le=\"" + le + "\"} " + std::to_string(cumulative) + "\n";
  }
  out += name + "_sum " + number(sum_) + "\n";
  out += name + "_count " + std::to_string(count_) + "\n";
}

ServerMetrics::ServerMetrics()
    : ttft_({0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}),
      itl_({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}) {}

void ServerMetrics::count_request(const std::string& route, int status) {
  std::lock_guard lock(mu_);
  ++requests_[{route, status}];
}

void ServerMetrics::count_prompt_tokens(int64_t n) {
  std::lock_guard lock(mu_);
  prompt_tokens_ += n;
}

void ServerMetrics::count_generated_tokens(int64_t n) {
  std::lock_guard lock(mu_);
  generated_tokens_ += n;
}

void ServerMetrics::count_cancelled() {
  std::lock_guard lock(mu_);
  ++cancelled_;
}

void ServerMetrics::observe_time_to_first_token(double seconds) {
  std::lock_guard lock(mu_);
  ttft_.observe(seconds);
}

void ServerMetrics::observe_inter_token_latency(double seconds) {
  std::lock_guard lock(mu_);
  itl_.observe(seconds);
}

std::string ServerMetrics::render(const EngineGauges& gauges) const {
  std::lock_guard lock(mu_);
  std::string out;
  header(out, "xmoe_http_requests_total", "counter", "HTTP requests answered, by route and status.");
  for (const auto& [key, count] : requests_)
    out += "xmoe_http_requests_total{route=\"" + label_value(key.first) + "\",status=\"" +
           std::to_string(key.second) + "\"} " + std::to_string(count) + "\n";
  header(out, "xmoe_prompt_tokens_total", "counter", "Prompt tokens of accepted generation requests.");
  sample(out, "xmoe_prompt_tokens_total", static_cast<double>(prompt_tokens_));
  header(out, "xmoe_generation_tokens_total", "counter", "Tokens generated.");
  sample(out, "xmoe_generation_tokens_total", static_cast<double>(generated_tokens_));
  header(out, "xmoe_requests_cancelled_total", "counter",
         "Generation requests cancelled before their end (client gone, shutdown).");
  sample(out, "xmoe_requests_cancelled_total", static_cast<double>(cancelled_));
  header(out, "xmoe_time_to_first_token_seconds", "histogram",
         "From a request's submission to its first generated token.");
  ttft_.render("xmoe_time_to_first_token_seconds", out);
  header(out, "xmoe_inter_token_latency_seconds", "histogram",
         "Between consecutive generated tokens of one sequence.");
  itl_.render("xmoe_inter_token_latency_seconds", out);
  header(out, "xmoe_queue_depth", "gauge", "Sequences waiting to join the batch.");
  sample(out, "xmoe_queue_depth", static_cast<double>(gauges.queue_depth));
  header(out, "xmoe_running_sequences", "gauge", "Sequences in the running batch.");
  sample(out, "xmoe_running_sequences", static_cast<double>(gauges.running));
  header(out, "xmoe_running_sequences_peak", "gauge",
         "The most sequences in the running batch at once since the server started.");
  sample(out, "xmoe_running_sequences_peak", static_cast<double>(gauges.running_peak));
  header(out, "xmoe_kv_cache_blocks_used", "gauge", "KV-cache blocks held by sequences.");
  sample(out, "xmoe_kv_cache_blocks_used", static_cast<double>(gauges.kv_blocks_used));
  header(out, "xmoe_kv_cache_blocks_total", "gauge", "KV-cache blocks in all.");
  sample(out, "xmoe_kv_cache_blocks_total", static_cast<double>(gauges.kv_blocks_total));
  return out;
}

}  // namespace xmoe::serve
