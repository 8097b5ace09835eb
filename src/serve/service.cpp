#include "serve/service.hpp"

#include <omp.h>

#include <algorithm>
#include <deque>
#include <optional>

#include "xmoe/error.hpp"

namespace xmoe::serve {

using Clock = std::chrono::steady_clock;

struct Service::RequestState {
  explicit RequestState(int n)
      : open(n), ids(static_cast<size_t>(n), 0), last_token(static_cast<size_t>(n)) {}

  // Shared between the driver (producer) and the stream (consumer).
  std::mutex mu;
  std::condition_variable cv;
  std::deque<GenerationDelta> deltas;
  int open;                       // indexes whose finish has not been queued
  bool cancelled = false;         // by the stream's owner
  std::optional<ApiError> error;  // the request failed; thrown by next() once the queue is drained

  // Driver thread only.
  std::vector<llm::RequestId> ids;  // engine id per index (0 until submitted)
  Clock::time_point submitted = Clock::now();
  bool first_token_seen = false;
  std::vector<Clock::time_point> last_token;
};

namespace {

void append(GenerationDelta& into, GenerationDelta& from) {
  into.text += from.text;
  into.tokens.insert(into.tokens.end(), from.tokens.begin(), from.tokens.end());
  for (auto& lp : from.logprobs) into.logprobs.push_back(std::move(lp));
  into.finish = from.finish;
  into.stop_string = std::move(from.stop_string);
}

}  // namespace

class ServiceStream final : public GenerationStream {
 public:
  ServiceStream(Service& service, std::shared_ptr<Service::RequestState> state, int64_t prompt_tokens)
      : service_(service), state_(std::move(state)) {
    prompt_tokens_ = prompt_tokens;
  }
  ~ServiceStream() override { cancel(); }

  bool next(GenerationDelta& out) override {
    Service::RequestState& st = *state_;
    std::unique_lock lock(st.mu);
    st.cv.wait(lock, [&] { return !st.deltas.empty() || st.open == 0 || st.error; });
    if (!st.deltas.empty()) {
      out = std::move(st.deltas.front());
      st.deltas.pop_front();
      // A consumer that fell behind gets what queued up for this index as one delta.
      while (!st.deltas.empty() && st.deltas.front().index == out.index &&
             out.finish == llm::FinishReason::none) {
        append(out, st.deltas.front());
        st.deltas.pop_front();
      }
      return true;
    }
    if (st.error) throw *st.error;
    return false;
  }

  void cancel() override {
    {
      std::lock_guard lock(state_->mu);
      if (state_->cancelled || state_->open == 0 || state_->error) return;
      state_->cancelled = true;
      state_->open = 0;
      state_->deltas.clear();
    }
    state_->cv.notify_all();
    service_.request_cancel(state_);
  }

 private:
  Service& service_;
  std::shared_ptr<Service::RequestState> state_;
};

Service::Service(llm::CausalLM& model, ModelInfo info, ServiceOptions options, ServerMetrics* metrics)
    : model_(model), info_(std::move(info)), options_(std::move(options)), metrics_(metrics) {
  XMOE_CHECK(options_.max_seq_len >= 2, "serve: max_seq_len must be >= 2, got ", options_.max_seq_len);
  XMOE_CHECK(options_.max_queue >= 0, "serve: max_queue must be >= 0, got ", options_.max_queue);
  XMOE_CHECK(static_cast<bool>(options_.engine.text_stream), "serve: the engine needs a text stream");
  info_.max_seq_len = options_.max_seq_len;
  engine_ = std::make_unique<llm::Engine>(model_, options_.engine);
  cache_capacity_tokens_ = engine_->kv_cache().max_tokens();
  publish_gauges();
  // OpenMP's thread count is a per-thread setting: the driver runs the model's parallel regions, so it takes
  // the count its creator was given (xmoe serve --threads), not the process default.
  const int threads = omp_get_max_threads();
  driver_ = std::thread([this, threads] {
    omp_set_num_threads(threads);
    drive();
  });
}

Service::~Service() {
  shutdown(std::chrono::milliseconds(0));
}

std::unique_ptr<GenerationStream> Service::submit(SubmitRequest request) {
  const auto prompt_tokens = static_cast<int64_t>(request.prompt.size());
  const int64_t limit = options_.max_seq_len;
  const int n = request.settings.n;
  if (request.prompt.empty()) throw ApiError(400, "invalid_request_error", "the prompt is empty", "prompt");
  const int64_t vocab = info_.config ? info_.config->vocab_size : model_.config().vocab_size;
  for (size_t i = 0; i < request.prompt.size(); ++i)
    if (request.prompt[i] < 0 || request.prompt[i] >= vocab)
      throw ApiError(400, "invalid_request_error",
                     "prompt token " + std::to_string(i) + " is " + std::to_string(request.prompt[i]) +
                         ", outside the vocabulary [0, " + std::to_string(vocab) + ")",
                     "prompt");
  if (n < 1 || n > 128)
    throw ApiError(400, "invalid_request_error", "n must be in [1, 128], got " + std::to_string(n), "n");
  if (request.settings.top_logprobs < 0 || request.settings.top_logprobs > 20)
    throw ApiError(400, "invalid_request_error",
                   "top_logprobs must be in [0, 20], got " + std::to_string(request.settings.top_logprobs),
                   "top_logprobs");
  if (prompt_tokens >= limit)
    throw ApiError(400, "invalid_request_error",
                   "the prompt has " + std::to_string(prompt_tokens) +
                       " tokens; this model's maximum context length is " + std::to_string(limit) +
                       " tokens (--max-seq-len), which must also leave room for at least one generated token",
                   "messages");
  if (request.max_tokens <= 0) request.max_tokens = limit - prompt_tokens;
  if (prompt_tokens + request.max_tokens > limit)
    throw ApiError(400, "invalid_request_error",
                   "this model's maximum context length is " + std::to_string(limit) +
                       " tokens (--max-seq-len); the request asks for " +
                       std::to_string(prompt_tokens + request.max_tokens) + " tokens (" +
                       std::to_string(prompt_tokens) + " in the prompt, " +
                       std::to_string(request.max_tokens) + " to generate)",
                   "max_tokens");
  if (prompt_tokens > cache_capacity_tokens_)
    throw ApiError(400, "invalid_request_error",
                   "the prompt has " + std::to_string(prompt_tokens) +
                       " tokens, more than the KV cache holds (" + std::to_string(cache_capacity_tokens_) +
                       " tokens; raise --kv-cache-mb)",
                   "messages");
  try {
    request.settings.sampling.validate();
  } catch (const Error& e) {
    throw ApiError(400, "invalid_request_error", e.what());
  }

  auto state = std::make_shared<RequestState>(n);
  {
    std::lock_guard lock(mu_);
    if (!accepting_) throw ApiError(503, "server_error", "the server is shutting down");
    const int64_t capacity = options_.engine.max_running + options_.max_queue;
    if (in_flight_ + n > capacity)
      throw ApiError(429, "rate_limit_error",
                     "the server is busy: " + std::to_string(in_flight_) + " sequences in flight, at most " +
                         std::to_string(capacity) + " (--max-batch " +
                         std::to_string(options_.engine.max_running) + " running + --max-queue " +
                         std::to_string(options_.max_queue) + " waiting); retry later");
    in_flight_ += n;
    inbox_.push_back({state, std::move(request)});
  }
  wake_.notify_one();
  if (metrics_) metrics_->count_prompt_tokens(prompt_tokens);
  return std::make_unique<ServiceStream>(*this, std::move(state), prompt_tokens);
}

EngineGauges Service::gauges() const {
  std::lock_guard lock(mu_);
  return gauges_;
}

int64_t Service::in_flight() const {
  std::lock_guard lock(mu_);
  return in_flight_;
}

void Service::shutdown(std::chrono::milliseconds grace) {
  std::unique_lock lock(mu_);
  if (stop_) return;
  accepting_ = false;
  drained_.wait_for(lock, grace, [&] { return in_flight_ == 0; });
  stop_ = true;
  lock.unlock();
  wake_.notify_all();
  if (driver_.joinable()) driver_.join();
}

void Service::request_cancel(const std::shared_ptr<RequestState>& state) {
  if (metrics_) metrics_->count_cancelled();
  {
    std::lock_guard lock(mu_);
    cancels_.push_back(state);
  }
  wake_.notify_one();
}

void Service::finish_sequences(int64_t n) {
  if (n == 0) return;
  std::lock_guard lock(mu_);
  in_flight_ -= n;
  if (in_flight_ == 0) drained_.notify_all();
}

void Service::fail(RequestState& state, int status, const std::string& type, const std::string& message) {
  {
    std::lock_guard lock(state.mu);
    if (!state.error) state.error.emplace(status, type, message);
  }
  state.cv.notify_all();
}

void Service::admit(Pending& pending) {
  RequestState& st = *pending.state;
  const SubmitRequest& r = pending.request;
  const int n = r.settings.n;
  {
    std::lock_guard lock(st.mu);
    if (st.cancelled) {
      finish_sequences(n);
      return;
    }
  }
  for (int i = 0; i < n; ++i) {
    llm::GenerationRequest g;
    g.prompt = r.prompt;
    g.sampling = r.settings.sampling;
    if (g.sampling.seed) g.sampling.seed = *g.sampling.seed + static_cast<uint64_t>(i);
    g.max_tokens = r.max_tokens;
    g.stop_token_ids = r.stop_token_ids;
    g.stop_strings = r.settings.stop;
    g.ignore_eos = r.settings.ignore_eos;
    g.logits_processor = r.logits_processor;
    if (r.settings.logprobs) g.logprobs = r.settings.top_logprobs;
    g.retain_result = false;
    g.on_delta = [this, state = pending.state, i](const llm::StreamDelta& d) { on_delta(state, i, d); };
    try {
      const llm::RequestId id = engine_->submit(std::move(g));
      st.ids[static_cast<size_t>(i)] = id;
      live_[id] = {pending.state, i};
    } catch (const std::exception& e) {
      fail(st, 400, "invalid_request_error", e.what());
      for (int j = 0; j < i; ++j) {
        const llm::RequestId id = st.ids[static_cast<size_t>(j)];
        if (live_.erase(id)) engine_->cancel(id);
      }
      finish_sequences(n);
      return;
    }
  }
}

void Service::on_delta(const std::shared_ptr<RequestState>& state, int index, llm::StreamDelta d) {
  RequestState& st = *state;
  const auto now = Clock::now();
  if (metrics_ && !d.token_ids.empty()) {
    metrics_->count_generated_tokens(static_cast<int64_t>(d.token_ids.size()));
    auto& last = st.last_token[static_cast<size_t>(index)];
    if (!st.first_token_seen) {
      st.first_token_seen = true;
      metrics_->observe_time_to_first_token(std::chrono::duration<double>(now - st.submitted).count());
    } else if (last != Clock::time_point{}) {
      metrics_->observe_inter_token_latency(std::chrono::duration<double>(now - last).count());
    }
    last = now;
  } else if (!d.token_ids.empty()) {
    st.first_token_seen = true;
  }
  const bool finished = d.finish != llm::FinishReason::none;
  if (!d.error.empty()) {
    fail(st, 500, "server_error", "generation failed: " + d.error);
    failed_in_step_.push_back(state);
  } else {
    GenerationDelta g;
    g.index = index;
    g.text = std::move(d.text);
    g.tokens = std::move(d.token_ids);
    for (auto& lp : d.logprobs) g.logprobs.push_back({lp.token, lp.logprob, std::move(lp.top)});
    g.finish = d.finish;
    g.stop_string = std::move(d.stop_string);
    {
      std::lock_guard lock(st.mu);
      if (!st.cancelled) {
        st.deltas.push_back(std::move(g));
        if (finished) --st.open;
      }
    }
    st.cv.notify_all();
  }
  if (finished) {
    live_.erase(d.request);
    finish_sequences(1);
  }
}

void Service::publish_gauges() {
  const llm::KvCache& cache = engine_->kv_cache();
  std::lock_guard lock(mu_);
  gauges_.running = engine_->running_count();
  gauges_.running_peak = std::max(gauges_.running_peak, gauges_.running);
  int64_t inbox = 0;
  for (const Pending& p : inbox_) inbox += p.request.settings.n;
  gauges_.queue_depth = engine_->waiting_count() + inbox;
  gauges_.kv_blocks_total = cache.total_blocks();
  gauges_.kv_blocks_used = cache.total_blocks() - cache.free_blocks();
  engine_busy_ = !engine_->idle();
}

void Service::drive() {
  for (;;) {
    std::vector<Pending> inbox;
    std::vector<std::shared_ptr<RequestState>> cancels;
    bool stop = false;
    {
      std::unique_lock lock(mu_);
      wake_.wait(lock, [&] { return stop_ || !inbox_.empty() || !cancels_.empty() || engine_busy_; });
      inbox.swap(inbox_);
      cancels.swap(cancels_);
      stop = stop_;
    }
    if (stop) {
      const std::string message = "the server is shutting down; the request was cancelled";
      for (Pending& p : inbox) {
        fail(*p.state, 503, "server_error", message);
        finish_sequences(p.request.settings.n);
      }
      for (auto& [id, live] : live_) {
        fail(*live.state, 503, "server_error", message);
        engine_->cancel(id);
      }
      finish_sequences(static_cast<int64_t>(live_.size()));
      live_.clear();
      engine_->step();  // frees the cancelled sequences' blocks
      publish_gauges();
      return;
    }
    for (Pending& p : inbox) admit(p);
    for (const auto& st : cancels)
      for (const llm::RequestId id : st->ids)
        if (id != 0 && live_.erase(id)) {
          engine_->cancel(id);
          finish_sequences(1);
        }
    try {
      engine_->step();
    } catch (const std::exception& e) {
      // The model failed mid-step: the batch's requests fail, and a fresh engine serves the next ones.
      for (auto& [id, live] : live_)
        fail(*live.state, 500, "server_error", std::string("the model step failed: ") + e.what());
      finish_sequences(static_cast<int64_t>(live_.size()));
      live_.clear();
      engine_ = std::make_unique<llm::Engine>(model_, options_.engine);
    }
    // A request with a failed sequence stops its other sequences too.
    for (const auto& st : failed_in_step_)
      for (const llm::RequestId id : st->ids)
        if (id != 0 && live_.erase(id)) {
          engine_->cancel(id);
          finish_sequences(1);
        }
    failed_in_step_.clear();
    publish_gauges();
  }
}

}  // namespace xmoe::serve
