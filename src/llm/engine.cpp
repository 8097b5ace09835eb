#include "llm/engine.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <random>

#include "xmoe/error.hpp"

namespace xmoe::llm {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::stop:
      return "stop";
    case FinishReason::length:
      return "length";
    case FinishReason::none:
      break;
  }
  return "";
}

struct Engine::Sequence {
  RequestId id = 0;
  GenerationRequest request;
  Sampler sampler;
  PenaltyState penalties;
  std::vector<int32_t> tokens;  // prompt + generated
  int64_t computed = 0;         // leading tokens whose K/V are in the cache
  std::optional<SequenceId> cache_seq;
  std::unique_ptr<TextStream> text;
  std::optional<StopStringMatcher> stops;
  GenerationResult result;
  bool finished = false;
  bool cancelled = false;

  Sequence(RequestId i, GenerationRequest r, uint64_t seed)
      : id(i), request(std::move(r)), sampler(request.sampling, seed), tokens(request.prompt) {
    penalties.add_prompt(request.prompt);
    result.prompt_tokens = static_cast<int64_t>(request.prompt.size());
  }
  int64_t pending() const { return static_cast<int64_t>(tokens.size()) - computed; }
  int64_t generated() const { return static_cast<int64_t>(result.token_ids.size()); }
};

TokenLogprob token_logprob(std::span<const float> logits, double temperature, int32_t token, int top_n) {
  XMOE_CHECK(token >= 0 && static_cast<size_t>(token) < logits.size(), "logprobs: token ", token,
             " outside the logits row of ", logits.size());
  const double scale = temperature > 0.0 ? 1.0 / temperature : 1.0;
  double max_logit = -INFINITY;
  for (float l : logits) max_logit = std::max(max_logit, static_cast<double>(l));
  XMOE_CHECK(std::isfinite(max_logit), "logprobs: no finite logit");
  double sum = 0;
  for (float l : logits) sum += std::exp((static_cast<double>(l) - max_logit) * scale);
  const double log_z = std::log(sum);
  auto logprob_of = [&](int32_t t) {
    return static_cast<float>((static_cast<double>(logits[static_cast<size_t>(t)]) - max_logit) * scale -
                              log_z);
  };
  TokenLogprob out;
  out.token = token;
  out.logprob = logprob_of(token);
  const size_t n = std::min(logits.size(), static_cast<size_t>(std::max(top_n, 0)));
  if (n > 0) {
    std::vector<int32_t> ids(logits.size());
    std::iota(ids.begin(), ids.end(), 0);
    std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(n), ids.end(),
                      [&](int32_t a, int32_t b) {
                        const float la = logits[static_cast<size_t>(a)], lb = logits[static_cast<size_t>(b)];
                        return la > lb || (la == lb && a < b);
                      });
    for (size_t i = 0; i < n; ++i) out.top.emplace_back(ids[i], logprob_of(ids[i]));
  }
  return out;
}

Engine::Engine(CausalLM& model, EngineOptions options)
    : model_(model),
      options_(std::move(options)),
      cache_(model.kv_cache_shape(), model.dtype(), options_.kv_cache_bytes, options_.kv_block_size) {
  XMOE_CHECK(options_.max_step_tokens > 0, "engine: max_step_tokens must be > 0, got ",
             options_.max_step_tokens);
  XMOE_CHECK(options_.max_running > 0 && options_.max_running <= options_.max_step_tokens,
             "engine: max_running must be in [1, max_step_tokens = ", options_.max_step_tokens, "], got ",
             options_.max_running);
  capacity_tokens_ = cache_.max_tokens();
  if (options_.profile) model_.set_profile(options_.profile);
}

Engine::~Engine() {
  if (options_.profile) model_.set_profile(nullptr);
}

RequestId Engine::submit(GenerationRequest request) {
  const int64_t vocab = model_.config().vocab_size;
  XMOE_CHECK(!request.prompt.empty(), "engine: request has an empty prompt");
  for (size_t i = 0; i < request.prompt.size(); ++i)
    XMOE_CHECK(request.prompt[i] >= 0 && request.prompt[i] < vocab, "engine: prompt token ", i, " is ",
               request.prompt[i], ", outside the vocabulary [0, ", vocab, ")");
  XMOE_CHECK(static_cast<int64_t>(request.prompt.size()) <= capacity_tokens_, "engine: a prompt of ",
             request.prompt.size(), " tokens does not fit in the KV cache of ", capacity_tokens_,
             " tokens (raise the cache budget)");
  XMOE_CHECK(request.max_tokens >= 1, "engine: max_tokens must be >= 1, got ", request.max_tokens);
  XMOE_CHECK(request.stop_strings.empty() || options_.text_stream,
             "engine: stop strings need a tokenizer to decode text");
  request.sampling.validate();
  XMOE_CHECK(!request.logprobs || (*request.logprobs >= 0 && *request.logprobs <= model_.config().vocab_size),
             "engine: logprobs alternatives must be in [0, vocab size], got ", request.logprobs.value_or(0));
  const uint64_t seed = request.sampling.seed ? *request.sampling.seed : std::random_device{}();
  const RequestId id = next_id_++;
  auto seq = std::make_unique<Sequence>(id, std::move(request), seed);
  if (options_.text_stream) seq->text = options_.text_stream();
  if (!seq->request.stop_strings.empty()) seq->stops.emplace(seq->request.stop_strings);
  waiting_.push_back(std::move(seq));
  return id;
}

void Engine::preempt(Sequence& seq) {
  cache_.release(*seq.cache_seq);
  seq.cache_seq.reset();
  seq.computed = 0;
  ++seq.result.preemptions;
  ++stats_.preemptions;
}

std::vector<Engine::ScheduledChunk> Engine::schedule() {
  std::vector<ScheduledChunk> chunks;
  int64_t decoding = 0;
  for (const auto& s : running_) decoding += s->pending() == 1 ? 1 : 0;
  int64_t budget = options_.max_step_tokens - decoding;
  bool preempted = false;
  for (size_t i = 0; i < running_.size(); ++i) {
    Sequence& s = *running_[i];
    const int64_t len = s.pending() == 1 ? 1 : std::min(s.pending(), budget);
    if (len <= 0) continue;  // prefill resumes when the budget allows
    bool placed = true;
    while (!cache_.reserve(*s.cache_seq, s.computed + len)) {
      if (running_.size() == 1) {
        // Alone and still out of room: the sequence is as long as the whole cache.
        StreamDelta delta;
        delta.request = s.id;
        finish(s, FinishReason::length, delta);
        placed = false;
        break;
      }
      Sequence& victim = *running_.back();
      preempt(victim);
      waiting_.push_front(std::move(running_.back()));
      running_.pop_back();
      preempted = true;
      if (&victim == &s) {
        placed = false;
        break;
      }
    }
    if (!placed) break;
    if (len > 1) budget -= len;
    chunks.push_back({&s, len});
  }
  // New sequences join only when nothing had to make room this step (vLLM does the same), so a preempted
  // sequence is not pushed out again at once.
  while (!preempted && !waiting_.empty() && running_.size() < static_cast<size_t>(options_.max_running) &&
         budget > 0) {
    Sequence& s = *waiting_.front();
    const int64_t len = std::min(s.pending(), budget);
    if (cache_.blocks_for(len) > cache_.free_blocks()) break;
    const SequenceId cache_seq = cache_.create_sequence();
    if (!cache_.reserve(cache_seq, len)) {
      cache_.release(cache_seq);
      break;
    }
    s.cache_seq = cache_seq;
    s.computed = 0;
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
    budget -= len;
    chunks.push_back({&s, len});
  }
  return chunks;
}

bool Engine::cancel(RequestId id) {
  for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
    if ((*it)->id != id) continue;
    waiting_.erase(it);  // waiting sequences hold no cache blocks
    return true;
  }
  for (auto& s : running_) {
    if (s->id != id) continue;
    s->cancelled = true;
    return true;
  }
  return done_.erase(id) > 0;
}

bool Engine::release_finished() {
  bool any = false;
  for (auto& s : running_) {
    if (!s->finished && !s->cancelled) continue;
    any = true;
    cache_.release(*s->cache_seq);
    if (!s->cancelled && s->request.retain_result) done_.emplace(s->id, std::move(s->result));
  }
  std::erase_if(running_, [](const std::unique_ptr<Sequence>& s) { return s->finished || s->cancelled; });
  return any;
}

bool Engine::step() {
  release_finished();  // sequences cancelled since the last step
  if (idle()) return false;
  const auto start = std::chrono::steady_clock::now();
  std::optional<ProfileScope> overhead;  // what the model's and the sampler's scopes do not claim
  if (options_.profile) overhead.emplace(options_.profile, ProfileOp::engine);
  uint64_t step_weight_bytes = 0;
  const std::vector<ScheduledChunk> chunks = schedule();
  std::vector<SequenceChunk> batch;
  batch.reserve(chunks.size());
  int64_t prefill_tokens = 0, decode_tokens = 0;
  for (const ScheduledChunk& c : chunks) {
    Sequence& s = *c.seq;
    const bool decode = c.length == 1 && s.pending() == 1 && s.computed >= s.result.prompt_tokens;
    (decode ? decode_tokens : prefill_tokens) += c.length;
    batch.push_back({*s.cache_seq, std::span<const int32_t>(s.tokens.data() + s.computed, c.length), false});
  }
  if (!batch.empty()) {
    const uint64_t bytes_before = model_.weight_bytes_read();
    model_.forward(batch, cache_, logits_);
    step_weight_bytes = model_.weight_bytes_read() - bytes_before;
    const int64_t vocab = model_.config().vocab_size;
    XMOE_CHECK(logits_.size() == batch.size() * static_cast<size_t>(vocab), "engine: the model returned ",
               logits_.size(), " logits for ", batch.size(), " chunks of vocabulary ", vocab);
    std::vector<std::pair<Sequence*, std::span<float>>> ready;  // sequences to sample and their logits
    for (size_t i = 0; i < chunks.size(); ++i) {
      Sequence& s = *chunks[i].seq;
      s.computed += chunks[i].length;
      XMOE_CHECK(cache_.length(*s.cache_seq) == s.computed, "engine: the model left the cache of request ",
                 s.id, " at ", cache_.length(*s.cache_seq), " tokens, expected ", s.computed);
      if (s.pending() > 0 || s.cancelled) continue;  // more prompt to feed first
      ready.emplace_back(
          &s, std::span<float>(logits_.data() + i * static_cast<size_t>(vocab), static_cast<size_t>(vocab)));
    }
    sample_all(ready);
  }
  overhead.reset();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (options_.profile) {
    if (prefill_tokens > 0)
      options_.profile->end_step(StepProfile::Phase::prefill, prefill_tokens + decode_tokens, seconds);
    else if (decode_tokens > 0)
      options_.profile->end_step(StepProfile::Phase::decode, decode_tokens, seconds);
    else
      options_.profile->discard_step();
  }
  ++stats_.steps;
  stats_.max_batch_sequences = std::max(stats_.max_batch_sequences, static_cast<int>(batch.size()));
  if (prefill_tokens > 0) {
    ++stats_.prefill_steps;
    stats_.prefill_tokens += prefill_tokens;
    stats_.prefill_seconds += seconds;
  } else if (decode_tokens > 0) {
    ++stats_.decode_steps;
    stats_.decode_tokens += decode_tokens;
    stats_.decode_seconds += seconds;
    stats_.decode_weight_bytes += step_weight_bytes;
  }

  const bool any_finished = release_finished();
  XMOE_CHECK(!batch.empty() || any_finished || idle(), "engine: no sequence could be scheduled (",
             waiting_.size(), " waiting, ", running_.size(), " running)");
  return true;
}

void Engine::run_until_idle() {
  while (step()) {
  }
}

void Engine::sample_all(std::span<const std::pair<Sequence*, std::span<float>>> ready) {
  struct Draw {
    int32_t token = 0;
    std::optional<TokenLogprob> logprob;
    std::string error;  // this request's processing failed
  };
  std::vector<Draw> draws(ready.size());
  std::optional<ProfileScope> scope;  // the draws; accepting tokens (text, callbacks) is the engine's
  if (options_.profile)
    scope.emplace(options_.profile, ProfileOp::sampler,
                  static_cast<double>(ready.size()) * static_cast<double>(model_.config().vocab_size) * 4.0);
  // Logits processors are the caller's code, not necessarily safe to run concurrently: one at a time.
  for (size_t j = 0; j < ready.size(); ++j) {
    Sequence& seq = *ready[j].first;
    if (!seq.request.logits_processor) continue;
    try {
      seq.request.logits_processor(ready[j].second, seq.result.token_ids);
    } catch (const std::exception& e) {
      draws[j].error = e.what();
    }
  }
  // The draws (a pass over the vocabulary each, one sequence's state only) in parallel: with a batch of
  // sequences they are a step's largest serial part. A draw depends only on its sequence's logits, seed and
  // position, so the thread it runs on changes nothing.
  const auto count = static_cast<int64_t>(ready.size());
#pragma omp parallel for schedule(dynamic, 1) if (count > 1)
  for (int64_t j = 0; j < count; ++j) {
    Draw& d = draws[static_cast<size_t>(j)];
    if (!d.error.empty()) continue;
    Sequence& seq = *ready[static_cast<size_t>(j)].first;
    const std::span<float> row = ready[static_cast<size_t>(j)].second;
    try {
      d.token = seq.sampler.sample(row, seq.penalties, static_cast<uint64_t>(seq.generated()));
      if (seq.request.logprobs)
        d.logprob = token_logprob(row, seq.request.sampling.temperature, d.token, *seq.request.logprobs);
    } catch (const std::exception& e) {
      d.error = e.what();
    }
  }
  scope.reset();
  for (size_t j = 0; j < ready.size(); ++j) {
    Sequence& seq = *ready[j].first;
    if (seq.cancelled) continue;  // by an earlier sequence's stream callback in this loop
    Draw& d = draws[j];
    if (d.error.empty()) {
      accept_token(seq, d.token, std::move(d.logprob));
      continue;
    }
    // This request alone fails; the batch goes on.
    StreamDelta delta;
    delta.request = seq.id;
    delta.error = d.error;
    seq.result.error = d.error;
    finish(seq, FinishReason::stop, delta);
  }
}

void Engine::accept_token(Sequence& seq, int32_t token, std::optional<TokenLogprob> logprob) {
  seq.tokens.push_back(token);
  seq.penalties.add_generated(token);
  seq.result.token_ids.push_back(token);
  ++stats_.generated_tokens;
  StreamDelta delta;
  delta.request = seq.id;
  delta.token_ids.push_back(token);
  if (logprob) {
    seq.result.logprobs.push_back(*logprob);
    delta.logprobs.push_back(std::move(*logprob));
  }
  const auto& req = seq.request;
  const bool stop_token =
      std::find(req.stop_token_ids.begin(), req.stop_token_ids.end(), token) != req.stop_token_ids.end() ||
      (!req.ignore_eos && std::find(options_.eos_token_ids.begin(), options_.eos_token_ids.end(), token) !=
                              options_.eos_token_ids.end());
  if (stop_token) {
    seq.result.stop_token = token;
    finish(seq, FinishReason::stop, delta);
    return;
  }
  if (seq.text) {
    const std::string piece = seq.text->push(token);
    if (seq.stops) {
      StopStringMatcher::Result r = seq.stops->push(piece);
      delta.text = std::move(r.text);
      if (r.stopped) {
        seq.result.stop_string = r.stop_string;
        finish(seq, FinishReason::stop, delta);
        return;
      }
    } else {
      delta.text = piece;
    }
  }
  if (seq.generated() >= req.max_tokens) {
    finish(seq, FinishReason::length, delta);
    return;
  }
  seq.result.text += delta.text;
  if (req.on_delta) req.on_delta(delta);
}

void Engine::finish(Sequence& seq, FinishReason reason, StreamDelta& delta) {
  // Text still held back (an incomplete character, a partial stop string) is released unless a stop string
  // ended the request.
  if (seq.text && seq.result.stop_string.empty()) {
    const std::string tail = seq.text->flush();
    if (seq.stops) {
      StopStringMatcher::Result r = seq.stops->push(tail);
      delta.text += r.text;
      if (r.stopped) {
        seq.result.stop_string = r.stop_string;
        reason = FinishReason::stop;
      } else {
        delta.text += seq.stops->flush();
      }
    } else {
      delta.text += tail;
    }
  }
  seq.result.text += delta.text;
  seq.result.finish = reason;
  seq.finished = true;
  delta.finish = reason;
  delta.stop_string = seq.result.stop_string;
  if (seq.request.on_delta) seq.request.on_delta(delta);
}

bool Engine::finished(RequestId id) const {
  return done_.count(id) > 0;
}

GenerationResult Engine::take_result(RequestId id) {
  auto it = done_.find(id);
  XMOE_CHECK(it != done_.end(), "engine: request ", id, " is unknown or not finished");
  GenerationResult r = std::move(it->second);
  done_.erase(it);
  return r;
}

}  // namespace xmoe::llm
