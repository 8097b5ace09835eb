// The serving runtime behind the protocol adapters: one driver thread owns the engine and runs steps while
// there is work, so requests from every connection join one continuous batch. Each request gets a queue of
// deltas that its GenerationStream drains (blocking on a condition variable); cancellation comes from any
// thread and is applied by the driver before its next step (the sequence's KV blocks are freed then).
//
// Admission: at most max_batch + max_queue sequences in flight (submitted, not finished); beyond that
// submit() answers 429. A prompt plus max_tokens beyond max_seq_len answers 400 naming the limit. A request
// whose sampling fails ends alone with an error; an exception from the model step fails the requests in the
// batch and the engine is rebuilt, so later requests are served. Nothing is retained after a request's stream
// is drained.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "llm/engine.hpp"
#include "serve/backend.hpp"
#include "serve/metrics.hpp"

namespace xmoe::serve {

struct ServiceOptions {
  int64_t max_seq_len = 4096;
  int max_queue = 256;  // sequences waiting beyond the running batch (engine max_running)
  llm::EngineOptions engine;
};

class Service final : public Backend {
 public:
  // model and info's pointers must outlive the service. metrics may be null.
  Service(llm::CausalLM& model, ModelInfo info, ServiceOptions options, ServerMetrics* metrics);
  ~Service() override;  // shutdown(0)
  Service(const Service&) = delete;
  Service& operator=(const Service&) = delete;

  const ModelInfo& info() const override { return info_; }
  std::unique_ptr<GenerationStream> submit(SubmitRequest request) override;

  EngineGauges gauges() const;
  int64_t in_flight() const;  // sequences submitted and not finished
  // Refuses new requests (503), waits up to `grace` for those in flight, fails the rest (their streams throw
  // ApiError 503) and stops the driver. Idempotent.
  void shutdown(std::chrono::milliseconds grace);

  struct RequestState;

 private:
  friend class ServiceStream;
  struct Pending {
    std::shared_ptr<RequestState> state;
    SubmitRequest request;
  };
  struct Live {  // one engine sequence (driver thread only)
    std::shared_ptr<RequestState> state;
    int index = 0;
  };

  void request_cancel(const std::shared_ptr<RequestState>& state);
  void drive();
  void admit(Pending& pending);
  void on_delta(const std::shared_ptr<RequestState>& state, int index, llm::StreamDelta delta);
  void fail(RequestState& state, int status, const std::string& type, const std::string& message);
  void finish_sequences(int64_t n);
  void publish_gauges();

  llm::CausalLM& model_;
  ModelInfo info_;
  ServiceOptions options_;
  ServerMetrics* metrics_;
  int64_t cache_capacity_tokens_ = 0;

  // Driver thread only.
  std::unique_ptr<llm::Engine> engine_;
  std::unordered_map<llm::RequestId, Live> live_;
  std::vector<std::shared_ptr<RequestState>> failed_in_step_;

  mutable std::mutex mu_;
  std::condition_variable wake_;     // the driver: work, cancellations or stop
  std::condition_variable drained_;  // shutdown: in_flight_ reached 0
  std::vector<Pending> inbox_;
  std::vector<std::shared_ptr<RequestState>> cancels_;
  int64_t in_flight_ = 0;
  bool engine_busy_ = false;
  bool accepting_ = true;
  bool stop_ = false;
  EngineGauges gauges_;
  std::thread driver_;
};

}  // namespace xmoe::serve
