// Generation engine: many requests decoded together with continuous batching over a paged KV cache.
//
// Each step() builds one batch for CausalLM::forward:
//   1. running sequences, oldest first: a sequence in decode feeds its one new token; a sequence still
//      prefilling feeds its next chunk of at most the step's remaining prefill budget
//      (max_step_tokens minus one token per decoding sequence);
//   2. then waiting requests join, first come first served, while the budget, max_running and the cache allow
//      (not in a step that had to preempt).
// A sequence whose cache cannot grow preempts the newest running sequence: that one's blocks are freed and it
// returns to the front of the queue, to be recomputed (prompt + tokens generated so far) when it rejoins; its
// sampler draws by output position, so preemption does not change what it generates. A sequence that cannot
// grow while it is the only one running holds the whole cache; it finishes with reason `length`. A prompt
// that does not fit in the whole cache is refused at submit(), so the queue never waits forever.
//
// Timing (for tokens/s): a step that feeds any prefill token counts as prefill time; a step of decode tokens
// only counts as decode time.
// cancel() drops a waiting request at once and stops a running one: it is not stepped again and its KV blocks
// are freed at the start of the next step.
// Single-threaded API: submit/step/cancel from one thread. Stream callbacks run inside step() and must not
// throw; an exception from the model leaves the engine unusable. An exception from one sequence's sampling
// (its logits processor, logits it cannot sample from) finishes that sequence alone with `error` set.
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "llm/kv_cache.hpp"
#include "llm/model.hpp"
#include "llm/sampler.hpp"
#include "llm/stop_matcher.hpp"

namespace xmoe::llm {

// Turns one sequence's generated ids into text as they come, emitting complete UTF-8 only.
class TextStream {
 public:
  virtual ~TextStream() = default;
  virtual std::string push(int32_t token) = 0;
  virtual std::string flush() = 0;  // what is held back, at the end
};
using TextStreamFactory = std::function<std::unique_ptr<TextStream>()>;

enum class FinishReason { none, stop, length };
const char* finish_reason_name(FinishReason r);  // "", "stop", "length"

using RequestId = int64_t;

// A generated token's log-probability under the distribution it was drawn from, as OpenAI reports it: the
// log-softmax of the logits after the logits processor, the penalties and the temperature (temperature 0
// counts as 1), before top-k/top-p/min-p truncation.
struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;  // the most likely tokens at this position, best first
};

// Computes the TokenLogprob of `token` from a logits row that already carries the processor and penalties,
// with `top_n` alternatives (ties to the lower id).
TokenLogprob token_logprob(std::span<const float> logits, double temperature, int32_t token, int top_n);

struct StreamDelta {
  RequestId request = 0;
  std::string text;                    // new text, possibly empty while held back
  std::vector<int32_t> token_ids;      // tokens generated since the previous delta
  std::vector<TokenLogprob> logprobs;  // one per token id when the request asked for logprobs
  FinishReason finish = FinishReason::none;
  std::string stop_string;  // with the finish: the stop string that ended the request, if any
  std::string error;        // set with the finish when this request's processing failed (the others go on)
};

// Edits one sequence's logits row before sampling, given the tokens it generated so far.
using LogitsProcessor = std::function<void(std::span<float> logits, std::span<const int32_t> generated)>;
using StreamCallback = std::function<void(const StreamDelta&)>;

struct GenerationRequest {
  std::vector<int32_t> prompt;  // token ids, not empty, each < the model's vocab_size
  SamplingParams sampling;
  int64_t max_tokens = 256;               // >= 1, generated tokens including a final stop token
  std::vector<int32_t> stop_token_ids;    // end generation even with ignore_eos
  std::vector<std::string> stop_strings;  // need EngineOptions::text_stream
  bool ignore_eos = false;                // do not stop at EngineOptions::eos_token_ids
  StreamCallback on_delta;                // called from step(), after each new token and at the finish
  LogitsProcessor logits_processor;       // optional, applied before the penalties
  std::optional<int> logprobs;            // set: report each token's logprob with this many alternatives
  bool retain_result = true;              // false: nothing kept after the finish (streamed-only requests)
};

struct GenerationResult {
  std::vector<int32_t> token_ids;  // generated, including a stop token that ended the request
  std::string text;                // without a matched stop string (and without stop tokens)
  FinishReason finish = FinishReason::none;
  std::string stop_string;             // the stop string that matched, if any
  std::optional<int32_t> stop_token;   // the stop token that ended the request, if any
  std::vector<TokenLogprob> logprobs;  // per generated token when the request asked for logprobs
  std::string error;                   // this request's processing failed
  int64_t prompt_tokens = 0;
  int preemptions = 0;
};

struct EngineOptions {
  size_t kv_cache_bytes = size_t{512} << 20;
  int kv_block_size = 16;
  int64_t max_step_tokens = 512;  // tokens fed to the model per step (the prefill chunk budget)
  int max_running = 64;           // sequences in the batch at once, <= max_step_tokens
  std::vector<int32_t> eos_token_ids;
  TextStreamFactory text_stream;  // optional: without it results carry ids only
  // Optional: each step's time by op (llm/step_profile.hpp); the engine hands it to the model while it
  // lives. Off (null) costs nothing.
  StepProfile* profile = nullptr;
};

struct EngineStats {
  int64_t steps = 0;
  int64_t prefill_steps = 0, decode_steps = 0;
  int64_t prefill_tokens = 0;  // prompt (and recomputed) tokens fed
  double prefill_seconds = 0;  // steps that fed any prefill token
  int64_t decode_tokens = 0;   // tokens fed by decode-only steps
  double decode_seconds = 0;   // decode-only steps
  // Weights the model read in decode-only steps (CausalLM::weight_bytes_read).
  uint64_t decode_weight_bytes = 0;
  int64_t generated_tokens = 0;  // all sampled tokens
  int64_t preemptions = 0;
  int max_batch_sequences = 0;  // most sequences in one step
};

class Engine {
 public:
  Engine(CausalLM& model, EngineOptions options);
  ~Engine();

  // Queues a request; throws xmoe::Error for a bad one (empty prompt, id out of range, prompt larger than the
  // whole cache, bad sampling parameters, stop strings without a text stream).
  RequestId submit(GenerationRequest request);
  // Runs one model step; false when there was nothing to do.
  bool step();
  void run_until_idle();
  // Stops a request (see above); a finished one's result is dropped. False when the id is unknown.
  bool cancel(RequestId id);
  bool idle() const { return running_.empty() && waiting_.empty(); }

  bool finished(RequestId id) const;
  // The finished request's result (removed from the engine); throws when unknown or not finished.
  GenerationResult take_result(RequestId id);

  const EngineStats& stats() const { return stats_; }
  const KvCache& kv_cache() const { return cache_; }
  int64_t running_count() const { return static_cast<int64_t>(running_.size()); }
  int64_t waiting_count() const { return static_cast<int64_t>(waiting_.size()); }

 private:
  struct Sequence;
  struct ScheduledChunk {
    Sequence* seq;
    int64_t length;
  };
  std::vector<ScheduledChunk> schedule();
  void preempt(Sequence& seq);
  void accept_token(Sequence& seq, int32_t token, std::optional<TokenLogprob> logprob);
  void finish(Sequence& seq, FinishReason reason, StreamDelta& delta);
  // Samples each ready sequence's next token from its logits row and accepts it (or finishes it with its
  // error).
  void sample_all(std::span<const std::pair<Sequence*, std::span<float>>> ready);
  bool release_finished();  // finished and cancelled sequences leave the batch; true when any did

  CausalLM& model_;
  EngineOptions options_;
  KvCache cache_;
  int64_t capacity_tokens_ = 0;
  RequestId next_id_ = 1;
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::vector<std::unique_ptr<Sequence>> running_;  // oldest admission first
  std::map<RequestId, GenerationResult> done_;
  EngineStats stats_;
  std::vector<float> logits_;
};

}  // namespace xmoe::llm
