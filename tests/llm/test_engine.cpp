// The generation engine: continuous batching, chunked prefill, cache budget and preemption, stop conditions
// and streaming. Engine logic runs on a toy model (a deterministic function of each sequence's tokens, read
// back from the paged cache) so every expectation is exact.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "llm/checkpoint.hpp"
#include "llm/engine.hpp"
#include "util/random.hpp"
#include "xmoe/error.hpp"
#include "xmoe/safetensors.hpp"

namespace xmoe::llm {
namespace {

constexpr int kVocab = 40;

// Stores each token id (K) and its position (V) in the paged cache and derives a sequence's next-token logits
// from the ids it reads back, so a wrong block table, a missing reservation or a mixed-up batch changes the
// output.
class ToyModel final : public CausalLM {
 public:
  ToyModel() {
    config_.architecture = "ToyForCausalLM";
    config_.vocab_size = kVocab;
    config_.num_hidden_layers = 1;
    config_.num_key_value_heads = 1;
    config_.num_attention_heads = 1;
    config_.head_dim = 1;
    config_.hidden_size = 1;
  }
  const ModelConfig& config() const override { return config_; }
  DType dtype() const override { return DType::f32; }
  size_t weight_bytes_per_token() const override { return 1000; }
  uint64_t weight_bytes_read() const override { return bytes_read_; }

  void forward(std::span<const SequenceChunk> batch, KvCache& cache, std::vector<float>& logits) override {
    ++calls;
    bytes_read_ += 1000;  // a step's weights, plus one byte per token
    for (const SequenceChunk& chunk : batch) bytes_read_ += chunk.tokens.size();
    bool has_prefill = false, has_decode = false;
    logits.assign(batch.size() * kVocab, 0.0f);
    for (size_t c = 0; c < batch.size(); ++c) {
      const SequenceChunk& chunk = batch[c];
      (chunk.tokens.size() > 1 ? has_prefill : has_decode) = true;
      const int64_t start = cache.length(chunk.seq);
      const int64_t end = start + static_cast<int64_t>(chunk.tokens.size());
      const auto& table = cache.block_table(chunk.seq);
      const int bs = cache.block_size();
      XMOE_CHECK(end <= static_cast<int64_t>(table.size()) * bs, "toy model: cache room not reserved");
      for (int64_t p = start; p < end; ++p) {
        auto* k = static_cast<float*>(cache.key_block(0, table[static_cast<size_t>(p / bs)]));
        auto* v = static_cast<float*>(cache.value_block(0, table[static_cast<size_t>(p / bs)]));
        k[p % bs] = static_cast<float>(chunk.tokens[static_cast<size_t>(p - start)]);
        v[p % bs] = static_cast<float>(p);
      }
      cache.set_length(chunk.seq, end);
      uint64_t h = 1469598103934665603ull;
      for (int64_t p = 0; p < end; ++p) {
        const auto* k = static_cast<const float*>(cache.key_block(0, table[static_cast<size_t>(p / bs)]));
        const auto* v = static_cast<const float*>(cache.value_block(0, table[static_cast<size_t>(p / bs)]));
        XMOE_CHECK(v[p % bs] == static_cast<float>(p), "toy model: cache slot of position ", p,
                   " overwritten");
        h = splitmix64(h ^ static_cast<uint64_t>(k[p % bs]));
      }
      const CounterRng rng(h);
      for (int t = 0; t < kVocab; ++t)
        logits[c * kVocab + static_cast<size_t>(t)] =
            static_cast<float>(4.0 * rng.uniform(static_cast<uint64_t>(t)));
    }
    if (has_prefill && has_decode) ++mixed_calls;
  }

  int calls = 0;
  int mixed_calls = 0;

 private:
  uint64_t bytes_read_ = 0;
  ModelConfig config_;
};

// Token t decodes to a short ASCII piece; pieces of different lengths make stop strings cross boundaries.
std::string piece_of(int32_t t) {
  std::string s(1, static_cast<char>('a' + t % 26));
  if (t % 4 == 0) s += ' ';
  if (t >= 26) s += 'x';
  if (t % 7 == 3) s += ".,";
  return s;
}

class ToyText final : public TextStream {
 public:
  std::string push(int32_t token) override { return piece_of(token); }
  std::string flush() override { return {}; }
};

EngineOptions toy_options(size_t cache_tokens = 4096, int64_t step_tokens = 512) {
  EngineOptions o;
  o.kv_block_size = 4;
  o.kv_cache_bytes = cache_tokens * 2 * sizeof(float);  // K and V of one float per token
  o.max_step_tokens = step_tokens;
  o.max_running = static_cast<int>(std::min<int64_t>(16, step_tokens));
  o.text_stream = [] { return std::make_unique<ToyText>(); };
  return o;
}

std::vector<int32_t> toy_prompt(int length, int salt) {
  std::vector<int32_t> p;
  for (int i = 0; i < length; ++i) p.push_back(static_cast<int32_t>((i * 7 + salt * 13 + 1) % kVocab));
  return p;
}

GenerationRequest make_request(int prompt_len, int salt, int64_t max_tokens, bool greedy) {
  GenerationRequest r;
  r.prompt = toy_prompt(prompt_len, salt);
  r.max_tokens = max_tokens;
  if (greedy) {
    r.sampling.temperature = 0;
    r.sampling.repetition_penalty = 1.3;
  } else {
    r.sampling.temperature = 0.9;
    r.sampling.top_k = 12;
    r.sampling.top_p = 0.95;
    r.sampling.presence_penalty = 0.5;
    r.sampling.seed = 100 + static_cast<uint64_t>(salt);
  }
  return r;
}

GenerationResult run_alone(GenerationRequest r, EngineOptions options = toy_options()) {
  ToyModel model;
  Engine engine(model, std::move(options));
  const RequestId id = engine.submit(std::move(r));
  engine.run_until_idle();
  return engine.take_result(id);
}

void expect_same(const GenerationResult& a, const GenerationResult& b) {
  EXPECT_EQ(a.token_ids, b.token_ids);
  EXPECT_EQ(a.text, b.text);
  EXPECT_EQ(a.finish, b.finish);
  EXPECT_EQ(a.stop_string, b.stop_string);
  EXPECT_EQ(a.stop_token, b.stop_token);
}

struct Streamed {
  std::string text;
  std::vector<int32_t> ids;
  int finishes = 0;
  FinishReason finish = FinishReason::none;
  std::string stop_string;
};

StreamCallback collect(Streamed& s) {
  return [&s](const StreamDelta& d) {
    EXPECT_EQ(s.finishes, 0) << "delta after the finish";
    s.text += d.text;
    s.ids.insert(s.ids.end(), d.token_ids.begin(), d.token_ids.end());
    if (d.finish != FinishReason::none) {
      ++s.finishes;
      s.finish = d.finish;
      s.stop_string = d.stop_string;
    }
  };
}

TEST(Engine, ContinuousBatchingEqualsRunningEachRequestAlone) {
  const int lengths[] = {1, 9, 23, 5, 40, 14, 3};
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < 7; ++i) {
    GenerationRequest r = make_request(lengths[i], i, 10 + 2 * i, i % 2 == 0);
    if (i == 3) r.stop_strings = {"zz", "q."};
    requests.push_back(r);
  }
  std::vector<GenerationResult> alone;
  for (const auto& r : requests) alone.push_back(run_alone(r));

  ToyModel model;
  EngineOptions options = toy_options(4096, 8);  // 8 tokens a step: prompts go in chunks next to decodes
  options.eos_token_ids = {};
  Engine engine(model, options);
  std::vector<RequestId> ids;
  std::vector<Streamed> streams(requests.size());
  // Requests arrive while others are decoding.
  for (size_t i = 0; i < requests.size(); ++i) {
    requests[i].on_delta = collect(streams[i]);
    ids.push_back(engine.submit(requests[i]));
    for (int s = 0; s < 3; ++s) engine.step();
  }
  engine.run_until_idle();
  int64_t prompt_tokens = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    SCOPED_TRACE(i);
    const GenerationResult r = engine.take_result(ids[i]);
    expect_same(r, alone[i]);
    EXPECT_EQ(streams[i].text, r.text);
    EXPECT_EQ(streams[i].ids, r.token_ids);
    EXPECT_EQ(streams[i].finishes, 1);
    EXPECT_EQ(streams[i].finish, r.finish);
    EXPECT_EQ(streams[i].stop_string, r.stop_string);
    EXPECT_EQ(r.prompt_tokens, lengths[i]);
    prompt_tokens += lengths[i];
  }
  EXPECT_GT(model.mixed_calls, 0);
  EXPECT_GT(engine.stats().max_batch_sequences, 2);
  EXPECT_EQ(engine.stats().prefill_tokens, prompt_tokens);
  EXPECT_EQ(engine.stats().preemptions, 0);
  // Only decode-only steps count toward the decode bandwidth: 1000 bytes a step plus one a token (ToyModel).
  const EngineStats& st = engine.stats();
  EXPECT_GT(st.decode_steps, 0);
  EXPECT_EQ(st.decode_weight_bytes, static_cast<uint64_t>(1000 * st.decode_steps + st.decode_tokens));
  EXPECT_TRUE(engine.idle());
  EXPECT_EQ(engine.kv_cache().free_blocks(), engine.kv_cache().total_blocks());
}

TEST(Engine, CacheBudgetExhaustionPreemptsAndRecomputesWithoutChangingResults) {
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < 5; ++i) {
    GenerationRequest r = make_request(6 + i, 20 + i, 20, i % 2 == 1);
    r.ignore_eos = true;
    requests.push_back(r);
  }
  std::vector<GenerationResult> alone;
  for (const auto& r : requests) alone.push_back(run_alone(r));

  ToyModel model;
  Engine engine(model, toy_options(40, 16));  // 10 blocks of 4 tokens; the five need 26-30 tokens each
  std::vector<RequestId> ids;
  for (const auto& r : requests) ids.push_back(engine.submit(r));
  int max_running = 0;
  while (engine.step()) {
    max_running = std::max<int>(max_running, static_cast<int>(engine.running_count()));
    EXPECT_GE(engine.kv_cache().free_blocks(), 0);
  }
  EXPECT_GT(engine.stats().preemptions, 0);
  EXPECT_GT(max_running, 1);
  int preempted_requests = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    SCOPED_TRACE(i);
    const GenerationResult r = engine.take_result(ids[i]);
    expect_same(r, alone[i]);
    EXPECT_EQ(r.finish, FinishReason::length);
    EXPECT_EQ(r.token_ids.size(), 20u);
    preempted_requests += r.preemptions > 0;
  }
  EXPECT_GT(preempted_requests, 0);
  EXPECT_EQ(engine.kv_cache().free_blocks(), engine.kv_cache().total_blocks());
}

TEST(Engine, ARequestLargerThanTheCacheIsRefusedOrEndsAtTheCacheSize) {
  ToyModel model;
  Engine engine(model, toy_options(8, 16));  // 2 blocks of 4 tokens
  EXPECT_THROW(engine.submit(make_request(9, 1, 5, true)), Error);
  GenerationRequest whole = make_request(8, 1, 5, true);
  whole.ignore_eos = true;
  const RequestId fills = engine.submit(whole);
  engine.run_until_idle();
  EXPECT_EQ(engine.take_result(fills).token_ids.size(), 1u);  // sampled from the full cache, never fed back
  GenerationRequest r = make_request(5, 1, 100, true);
  r.ignore_eos = true;
  const RequestId id = engine.submit(r);
  engine.run_until_idle();
  const GenerationResult res = engine.take_result(id);
  EXPECT_EQ(res.finish, FinishReason::length);
  EXPECT_EQ(res.token_ids.size(), 4u);  // the cache holds 8 tokens: 5 prompt + 3 fed back, one more sampled
}

TEST(Engine, MaxTokensEndsWithLength) {
  Streamed s;
  GenerationRequest r = make_request(7, 3, 9, false);
  r.on_delta = collect(s);
  const GenerationResult res = run_alone(r);
  EXPECT_EQ(res.finish, FinishReason::length);
  EXPECT_EQ(res.token_ids.size(), 9u);
  std::string text;
  for (int32_t t : res.token_ids) text += piece_of(t);
  EXPECT_EQ(res.text, text);
  EXPECT_EQ(s.text, text);
  EXPECT_EQ(s.ids, res.token_ids);
  EXPECT_EQ(s.finish, FinishReason::length);
}

// The first n such that the pieces of ids[0, n) contain `stop`.
size_t tokens_until(const std::vector<int32_t>& ids, const std::string& stop) {
  std::string text;
  for (size_t n = 0; n < ids.size(); ++n) {
    text += piece_of(ids[n]);
    if (text.find(stop) != std::string::npos) return n + 1;
  }
  return ids.size();
}

TEST(Engine, StopStringsAcrossTokenBoundariesAreCutAndNeverEmitted) {
  GenerationRequest base = make_request(6, 5, 30, false);
  const GenerationResult full = run_alone(base);
  ASSERT_EQ(full.token_ids.size(), 30u);
  // A stop string that starts inside token 6's piece and ends inside token 7's.
  size_t boundary = 0;
  for (size_t i = 0; i < 7; ++i) boundary += piece_of(full.token_ids[i]).size();
  const std::string stop = full.text.substr(boundary - 1, 3);
  const size_t at = full.text.find(stop);
  ASSERT_LE(at, boundary - 1);

  GenerationRequest r = base;
  r.stop_strings = {"NEVER", stop};
  Streamed s;
  r.on_delta = collect(s);
  const GenerationResult res = run_alone(r);
  EXPECT_EQ(res.finish, FinishReason::stop);
  EXPECT_EQ(res.stop_string, stop);
  EXPECT_EQ(res.text, full.text.substr(0, at));
  EXPECT_EQ(s.text, res.text);
  const size_t n = tokens_until(full.token_ids, stop);
  EXPECT_EQ(res.token_ids, std::vector<int32_t>(full.token_ids.begin(), full.token_ids.begin() + n));
  EXPECT_FALSE(res.stop_token.has_value());

  // Of two stop strings, the one that starts first wins whatever their order.
  GenerationRequest two = base;
  const std::string later = full.text.substr(at + 1, 3);
  two.stop_strings = {later, stop};
  const GenerationResult res2 = run_alone(two);
  const size_t later_at = full.text.find(later);
  EXPECT_EQ(res2.text, full.text.substr(0, std::min(at, later_at)));
}

TEST(Engine, HeldBackTextIsReleasedWhenTheStopStringNeverCompletes) {
  GenerationRequest base = make_request(4, 9, 12, true);
  const GenerationResult full = run_alone(base);
  GenerationRequest r = base;
  r.stop_strings = {full.text.substr(full.text.size() - 2) + "#"};  // the text ends with its first 2 chars
  Streamed s;
  std::vector<std::string> deltas;
  r.on_delta = [&](const StreamDelta& d) {
    collect(s)(d);
    deltas.push_back(d.text);
  };
  const GenerationResult res = run_alone(r);
  EXPECT_EQ(res.finish, FinishReason::length);
  EXPECT_EQ(res.text, full.text);
  EXPECT_EQ(s.text, full.text);
  // The last two characters were held back until the finish.
  ASSERT_FALSE(deltas.empty());
  EXPECT_GE(deltas.back().size(), 2u);
}

TEST(StopStringMatcher, HoldsBackPossibleStartsAndCutsAtTheEarliestMatch) {
  StopStringMatcher m({"END"});
  EXPECT_EQ(m.push("abcE").text, "abc");
  EXPECT_EQ(m.push("N").text, "");
  EXPECT_EQ(m.push("x").text, "ENx");
  EXPECT_EQ(m.push("xEN").text, "x");
  const StopStringMatcher::Result r = m.push("D and more");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "");
  EXPECT_EQ(r.stop_string, "END");
  EXPECT_TRUE(m.push("more").stopped);
  EXPECT_EQ(m.flush(), "");

  StopStringMatcher first({"bc", "ab"});
  const StopStringMatcher::Result both = first.push("xabc");
  EXPECT_EQ(both.text, "x");
  EXPECT_EQ(both.stop_string, "ab");

  StopStringMatcher tail({"\xc3\xa9!"});  // "é!": a multi-byte character is held back whole
  EXPECT_EQ(tail.push("caf\xc3\xa9").text, "caf");
  EXPECT_EQ(tail.flush(), "\xc3\xa9");
  EXPECT_THROW(StopStringMatcher({"a", ""}), Error);
}

TEST(Engine, PenaltiesSeePromptAndGeneratedTokens) {
  // Toy logits are in [0, 4): a huge repetition penalty sends every seen token to ~0, a presence penalty of
  // 10 below every unseen one, so greedy decoding never repeats (the vocabulary is larger than prompt +
  // output).
  GenerationRequest rep = make_request(8, 4, 20, true);
  rep.ignore_eos = true;
  rep.sampling.repetition_penalty = 1e6;
  const GenerationResult a = run_alone(rep);
  std::vector<int32_t> seen = rep.prompt;
  for (int32_t t : a.token_ids) {
    EXPECT_EQ(std::count(seen.begin(), seen.end(), t), 0) << "token " << t;
    seen.push_back(t);
  }
  GenerationRequest presence = make_request(8, 4, 20, true);
  presence.sampling.repetition_penalty = 1.0;
  presence.sampling.presence_penalty = 10;
  const GenerationResult b = run_alone(presence);
  std::vector<int32_t> sorted = b.token_ids;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(std::adjacent_find(sorted.begin(), sorted.end()), sorted.end());
}

TEST(Engine, StopTokensAndEos) {
  GenerationRequest base = make_request(8, 11, 25, false);
  base.ignore_eos = true;
  const GenerationResult full = run_alone(base);
  ASSERT_EQ(full.token_ids.size(), 25u);
  const int32_t tok = full.token_ids[5];
  const size_t first = static_cast<size_t>(std::find(full.token_ids.begin(), full.token_ids.end(), tok) -
                                           full.token_ids.begin());
  std::string text_before;
  for (size_t i = 0; i < first; ++i) text_before += piece_of(full.token_ids[i]);
  const std::vector<int32_t> ids_through(full.token_ids.begin(), full.token_ids.begin() + first + 1);

  // A user stop token ends the request even with ignore_eos; it is in the ids, not in the text.
  GenerationRequest user = base;
  user.stop_token_ids = {tok};
  const GenerationResult by_user = run_alone(user);
  EXPECT_EQ(by_user.finish, FinishReason::stop);
  EXPECT_EQ(by_user.stop_token, tok);
  EXPECT_EQ(by_user.token_ids, ids_through);
  EXPECT_EQ(by_user.text, text_before);

  // The model's eos ends it unless ignore_eos.
  EngineOptions with_eos = toy_options();
  with_eos.eos_token_ids = {999, tok};
  GenerationRequest eos = base;
  eos.ignore_eos = false;
  const GenerationResult by_eos = run_alone(eos, with_eos);
  EXPECT_EQ(by_eos.token_ids, ids_through);
  EXPECT_EQ(by_eos.finish, FinishReason::stop);
  const GenerationResult ignored = run_alone(base, with_eos);
  expect_same(ignored, full);
}

TEST(Engine, SeedsReproduceAndDiffer) {
  GenerationRequest r = make_request(5, 2, 20, false);
  r.sampling.top_k = 0;
  r.sampling.temperature = 1.5;
  r.sampling.seed = 7;
  const GenerationResult a = run_alone(r), b = run_alone(r);
  expect_same(a, b);
  r.sampling.seed = 8;
  EXPECT_NE(run_alone(r).token_ids, a.token_ids);
}

TEST(Engine, CancelDropsAWaitingRequestAndFreesARunningOnesBlocksAtTheNextStep) {
  const GenerationRequest other = make_request(7, 5, 12, false);
  const GenerationResult other_alone = run_alone(other);
  ToyModel model;
  EngineOptions options = toy_options();
  options.max_running = 2;
  options.eos_token_ids = {};
  Engine engine(model, options);
  Streamed running, waiting;
  GenerationRequest a = make_request(9, 1, 100, true), b = make_request(4, 2, 100, true);
  a.on_delta = collect(running);
  b.on_delta = collect(waiting);
  const RequestId id_a = engine.submit(a);
  const RequestId id_other = engine.submit(other);
  const RequestId id_b = engine.submit(b);  // waits: two sequences already run
  for (int s = 0; s < 3; ++s) engine.step();
  EXPECT_EQ(engine.running_count(), 2);
  EXPECT_EQ(engine.waiting_count(), 1);
  EXPECT_TRUE(engine.cancel(id_b));
  EXPECT_EQ(engine.waiting_count(), 0);
  EXPECT_TRUE(waiting.ids.empty());

  const int64_t free_before = engine.kv_cache().free_blocks();
  EXPECT_TRUE(engine.cancel(id_a));
  const size_t tokens_at_cancel = running.ids.size();
  EXPECT_EQ(engine.kv_cache().free_blocks(), free_before) << "blocks are freed at the next step";
  engine.step();
  EXPECT_EQ(engine.running_count(), 1);
  EXPECT_GT(engine.kv_cache().free_blocks(), free_before);
  engine.run_until_idle();
  EXPECT_EQ(running.ids.size(), tokens_at_cancel) << "no delta after cancel";
  EXPECT_EQ(running.finishes, 0);
  EXPECT_FALSE(engine.finished(id_a));
  EXPECT_FALSE(engine.cancel(id_a));
  EXPECT_EQ(engine.kv_cache().free_blocks(), engine.kv_cache().total_blocks());
  expect_same(engine.take_result(id_other), other_alone);  // the batch went on undisturbed
}

TEST(Engine, ACallbackThatCancelsAnotherSequenceOfTheSameStepStopsItsToken) {
  // The step draws every sequence's token before it streams any: b's token of the step in which a's
  // callback cancels it must still not reach b.
  ToyModel model;
  EngineOptions options = toy_options();
  options.eos_token_ids = {};
  Engine engine(model, options);
  Streamed streamed_b;
  size_t b_tokens_at_cancel = 0;
  RequestId id_b = 0;
  GenerationRequest a = make_request(5, 1, 100, true), b = make_request(6, 2, 100, true);
  a.on_delta = [&](const StreamDelta& d) {
    if (d.token_ids.empty() || id_b == 0 || !engine.cancel(id_b)) return;
    b_tokens_at_cancel = streamed_b.ids.size();
    id_b = 0;
  };
  b.on_delta = collect(streamed_b);
  const RequestId id_a = engine.submit(a);
  id_b = engine.submit(b);
  const RequestId b_id = id_b;
  engine.step();  // both prompts
  EXPECT_EQ(id_b, 0) << "a's first token cancelled b";
  EXPECT_EQ(b_tokens_at_cancel, 0u);
  engine.run_until_idle();
  EXPECT_TRUE(streamed_b.ids.empty()) << "b got a token after its cancel";
  EXPECT_FALSE(engine.finished(b_id));
  EXPECT_EQ(engine.take_result(id_a).token_ids.size(), 100u);
}

// Oracle: log-softmax written out over the row the processor saw (no penalties here), in double.
TEST(Engine, LogprobsAreTheLogSoftmaxOfTheProcessedLogitsAtTheTemperature) {
  for (const double temperature : {0.0, 0.7}) {
    SCOPED_TRACE(temperature);
    GenerationRequest r = make_request(6, 3, 8, temperature == 0.0);
    r.sampling = SamplingParams{};
    r.sampling.temperature = temperature;
    r.sampling.seed = 11;
    r.logprobs = 5;
    std::vector<std::vector<float>> rows;
    r.logits_processor = [&rows](std::span<float> logits, std::span<const int32_t>) {
      rows.emplace_back(logits.begin(), logits.end());
    };
    const GenerationResult result = run_alone(r);
    ASSERT_EQ(result.logprobs.size(), result.token_ids.size());
    ASSERT_EQ(rows.size(), result.token_ids.size());
    const double t = temperature > 0 ? temperature : 1.0;
    for (size_t i = 0; i < rows.size(); ++i) {
      double z = 0;
      for (float l : rows[i]) z += std::exp(l / t);
      auto expected = [&](int32_t tok) { return rows[i][static_cast<size_t>(tok)] / t - std::log(z); };
      const TokenLogprob& lp = result.logprobs[i];
      EXPECT_EQ(lp.token, result.token_ids[i]);
      EXPECT_NEAR(lp.logprob, expected(lp.token), 1e-5);
      ASSERT_EQ(lp.top.size(), 5u);
      std::vector<int32_t> order(kVocab);
      for (int32_t k = 0; k < kVocab; ++k) order[static_cast<size_t>(k)] = k;
      std::stable_sort(order.begin(), order.end(),
                       [&](int32_t x, int32_t y) { return rows[i][x] > rows[i][y]; });
      for (size_t k = 0; k < 5; ++k) {
        EXPECT_EQ(lp.top[k].first, order[k]);
        EXPECT_NEAR(lp.top[k].second, expected(order[k]), 1e-5);
      }
      if (temperature == 0.0) {
        EXPECT_EQ(lp.top[0].first, lp.token);
      }
    }
  }
}

TEST(Engine, LogitsProcessorConstrainsTheDrawAndSeesTheOutputSoFar) {
  GenerationRequest r = make_request(5, 4, 12, false);
  size_t calls = 0;
  r.logits_processor = [&calls](std::span<float> logits, std::span<const int32_t> generated) {
    EXPECT_EQ(generated.size(), calls++);
    for (size_t t = 0; t < logits.size(); ++t)
      if (t % 3 != 0) logits[t] = -INFINITY;
  };
  const GenerationResult result = run_alone(r);
  ASSERT_FALSE(result.token_ids.empty());
  for (int32_t t : result.token_ids) EXPECT_EQ(t % 3, 0);
}

TEST(Engine, ARequestWhoseSamplingFailsFinishesAloneWithItsError) {
  const GenerationRequest good = make_request(8, 6, 15, true);
  const GenerationResult good_alone = run_alone(good);
  ToyModel model;
  EngineOptions options = toy_options();
  options.eos_token_ids = {};
  Engine engine(model, options);
  GenerationRequest bad = make_request(5, 7, 15, false);
  bad.logits_processor = [](std::span<float> logits, std::span<const int32_t> generated) {
    if (generated.size() == 3) std::fill(logits.begin(), logits.end(), -INFINITY);  // nothing to sample
  };
  Streamed streamed;
  std::string error;
  bad.on_delta = [&](const StreamDelta& d) {
    collect(streamed)(d);
    if (!d.error.empty()) error = d.error;
  };
  const RequestId id_bad = engine.submit(bad);
  const RequestId id_good = engine.submit(good);
  engine.run_until_idle();
  EXPECT_EQ(streamed.finishes, 1);
  EXPECT_EQ(streamed.ids.size(), 3u);
  EXPECT_NE(error.find("every logit is -inf"), std::string::npos) << error;
  EXPECT_EQ(engine.take_result(id_bad).error, error);
  expect_same(engine.take_result(id_good), good_alone);
  EXPECT_EQ(engine.kv_cache().free_blocks(), engine.kv_cache().total_blocks());
}

TEST(Engine, UnretainedResultsAreNotKeptAfterTheFinish) {
  ToyModel model;
  Engine engine(model, toy_options());
  GenerationRequest r = make_request(4, 1, 5, true);
  r.retain_result = false;
  Streamed streamed;
  r.on_delta = collect(streamed);
  const RequestId id = engine.submit(r);
  engine.run_until_idle();
  EXPECT_EQ(streamed.finishes, 1);
  EXPECT_FALSE(engine.finished(id));
}

TEST(Engine, RejectsBadRequestsAndOptions) {
  ToyModel model;
  Engine engine(model, toy_options());
  GenerationRequest empty;
  EXPECT_THROW(engine.submit(empty), Error);
  GenerationRequest out_of_vocab = make_request(3, 0, 4, true);
  out_of_vocab.prompt[1] = kVocab;
  EXPECT_THROW(engine.submit(out_of_vocab), Error);
  GenerationRequest no_tokens = make_request(3, 0, 0, true);
  EXPECT_THROW(engine.submit(no_tokens), Error);
  GenerationRequest bad_sampling = make_request(3, 0, 4, false);
  bad_sampling.sampling.top_p = 0;
  EXPECT_THROW(engine.submit(bad_sampling), Error);
  GenerationRequest empty_stop = make_request(3, 0, 4, true);
  empty_stop.stop_strings = {""};
  EXPECT_THROW(engine.submit(empty_stop), Error);
  EXPECT_TRUE(engine.idle());

  EngineOptions no_text = toy_options();
  no_text.text_stream = nullptr;
  Engine ids_only(model, no_text);
  GenerationRequest needs_text = make_request(3, 0, 4, true);
  needs_text.stop_strings = {"a"};
  EXPECT_THROW(ids_only.submit(needs_text), Error);

  EngineOptions bad = toy_options(4096, 8);
  bad.max_running = 9;
  EXPECT_THROW(Engine(model, bad), Error);
  EngineOptions tiny = toy_options();
  tiny.kv_cache_bytes = 10;
  EXPECT_THROW(Engine(model, tiny), Error);
  EXPECT_THROW(engine.take_result(12345), Error);
}

// The real Qwen3-MoE fixtures (tools/make_fixtures.py): transformers' greedy ids for three prompts of 5, 11
// and 17 tokens.
// "p{index}{what}" (built by appending: GCC 12 warns falsely on "literal" + std::string temporaries).
std::string tensor_key(int index, const char* what) {
  std::string key = "p";
  key += std::to_string(index);
  key += what;
  return key;
}

struct Qwen3Case {
  std::vector<int32_t> prompt, greedy;
};

std::vector<Qwen3Case> qwen3_cases(const std::string& expected_name) {
  const auto f = SafetensorsFile::open(std::string(XMOE_TEST_DATA_DIR) + "/models/" + expected_name);
  auto ids = [&](const std::string& name) {
    const auto bytes = f.bytes(name);
    std::vector<int32_t> v(bytes.size() / sizeof(int32_t));
    std::memcpy(v.data(), bytes.data(), bytes.size());
    return v;
  };
  std::vector<Qwen3Case> cases;
  for (int p = 0; p < 3; ++p) cases.push_back({ids(tensor_key(p, ".prompt")), ids(tensor_key(p, ".greedy"))});
  return cases;
}

std::vector<std::vector<int32_t>> run_greedy(CausalLM& model, const std::vector<Qwen3Case>& cases,
                                             EngineOptions options, bool together, int64_t* preemptions) {
  std::vector<std::vector<int32_t>> out;
  auto request = [](const Qwen3Case& c) {
    GenerationRequest r;
    r.prompt = c.prompt;
    r.max_tokens = static_cast<int64_t>(c.greedy.size());
    r.sampling.temperature = 0;
    r.ignore_eos = true;
    return r;
  };
  if (!together) {
    for (const auto& c : cases) {
      Engine engine(model, options);
      const RequestId id = engine.submit(request(c));
      engine.run_until_idle();
      out.push_back(engine.take_result(id).token_ids);
    }
    return out;
  }
  Engine engine(model, options);
  std::vector<RequestId> ids;
  for (const auto& c : cases) {
    ids.push_back(engine.submit(request(c)));
    engine.step();  // the next prompt arrives while this one is running
  }
  engine.run_until_idle();
  for (RequestId id : ids) out.push_back(engine.take_result(id).token_ids);
  if (preemptions) *preemptions = engine.stats().preemptions;
  return out;
}

TEST(EngineQwen3Moe, BatchedGreedyIdsEqualTransformersAndDecodingAlone) {
  const std::pair<std::string, std::string> models[] = {
      {"untied-yarn", "untied-yarn.expected.safetensors"},
      {"tied-sparse", "tied-sparse.expected.safetensors"},
      {"tied-sparse-fused", "tied-sparse.expected.safetensors"}};
  for (const auto& [dir, expected] : models) {
    SCOPED_TRACE(dir);
    const Checkpoint checkpoint = Checkpoint::open(std::string(XMOE_TEST_DATA_DIR) + "/models/" + dir);
    LoadOptions load;
    load.dtype = DType::f32;
    const std::unique_ptr<CausalLM> model = load_model(checkpoint, load);
    const std::vector<Qwen3Case> cases = qwen3_cases(expected);
    std::vector<std::vector<int32_t>> greedy;
    for (const auto& c : cases) greedy.push_back(c.greedy);

    EngineOptions options;
    options.kv_cache_bytes = size_t{1} << 20;
    options.kv_block_size = 4;
    options.max_step_tokens = 6;  // prompts in chunks, next to the other sequences' decode tokens
    options.max_running = 4;
    EXPECT_EQ(run_greedy(*model, cases, options, false, nullptr), greedy);
    EXPECT_EQ(run_greedy(*model, cases, options, true, nullptr), greedy);

    // A cache of 8 blocks of 4 tokens for sequences of 13, 19 and 25 tokens: preemption and recompute.
    const KvCacheShape shape = model->kv_cache_shape();
    options.kv_cache_bytes = 8 * 2 * 4 * sizeof(float) * static_cast<size_t>(shape.num_layers) *
                             static_cast<size_t>(shape.num_kv_heads) * static_cast<size_t>(shape.head_dim);
    int64_t preemptions = 0;
    EXPECT_EQ(run_greedy(*model, cases, options, true, &preemptions), greedy);
    EXPECT_GT(preemptions, 0);
  }
}

TEST(EngineQwen3Moe, Bf16BatchedEqualsAlone) {
  const Checkpoint checkpoint = Checkpoint::open(std::string(XMOE_TEST_DATA_DIR) + "/models/untied-yarn");
  LoadOptions load;
  load.dtype = DType::bf16;
  const std::unique_ptr<CausalLM> model = load_model(checkpoint, load);
  const std::vector<Qwen3Case> cases = qwen3_cases("untied-yarn.expected.safetensors");
  EngineOptions options;
  options.kv_cache_bytes = size_t{1} << 20;
  options.max_step_tokens = 8;
  options.max_running = 4;
  EXPECT_EQ(run_greedy(*model, cases, options, true, nullptr),
            run_greedy(*model, cases, options, false, nullptr));
}

}  // namespace
}  // namespace xmoe::llm
