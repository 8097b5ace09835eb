// The serving runtime over a real (tiny, random) Qwen3-MoE checkpoint. Oracle: the engine run alone on the
// same request (itself checked against transformers in tests/llm/test_engine.cpp): whatever the service
// batches, queues or cancels, a stream's tokens equal that. Logprobs are checked against a log-softmax
// written out over the logits the request's processor saw.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <thread>

#include "llm/checkpoint.hpp"
#include "llm/engine.hpp"
#include "llm/model.hpp"
#include "serve/service.hpp"
#include "xmoe/error.hpp"

namespace xmoe::serve {
namespace {

const std::string kModel = std::string(XMOE_TEST_DATA_DIR) + "/models/tied-sparse";

class ByteText final : public llm::TextStream {
 public:
  std::string push(int32_t token) override { return std::string(1, static_cast<char>('a' + token % 26)); }
  std::string flush() override { return {}; }
};

llm::EngineOptions engine_options(int max_running) {
  llm::EngineOptions o;
  o.kv_cache_bytes = size_t{4} << 20;
  o.max_running = max_running;
  o.max_step_tokens = 64;
  o.text_stream = [] { return std::make_unique<ByteText>(); };
  return o;
}

struct Fixture {
  llm::Checkpoint checkpoint = llm::Checkpoint::open(kModel);
  std::unique_ptr<llm::CausalLM> model = [this] {
    llm::LoadOptions load;
    load.dtype = DType::f32;
    return llm::load_model(checkpoint, load);
  }();

  std::unique_ptr<Service> service(int max_running = 8, int max_queue = 8, int64_t max_seq_len = 1 << 20,
                                   ServerMetrics* metrics = nullptr) {
    ServiceOptions o;
    o.max_seq_len = max_seq_len;
    o.max_queue = max_queue;
    o.engine = engine_options(max_running);
    ModelInfo info;
    info.served_name = "tiny";
    info.config = &checkpoint.config();
    return std::make_unique<Service>(*model, info, o, metrics);
  }

  llm::GenerationResult alone(const SubmitRequest& r, int index = 0) {
    llm::Engine engine(*model, engine_options(1));
    llm::GenerationRequest g;
    g.prompt = r.prompt;
    g.sampling = r.settings.sampling;
    if (g.sampling.seed) g.sampling.seed = *g.sampling.seed + static_cast<uint64_t>(index);
    g.max_tokens = r.max_tokens;
    g.ignore_eos = r.settings.ignore_eos;
    g.stop_strings = r.settings.stop;
    if (r.settings.logprobs) g.logprobs = r.settings.top_logprobs;
    const llm::RequestId id = engine.submit(g);
    engine.run_until_idle();
    return engine.take_result(id);
  }
};

Fixture& fixture() {
  static Fixture f;
  return f;
}

SubmitRequest request(int salt, int64_t max_tokens, double temperature = 0.0) {
  SubmitRequest r;
  for (int i = 0; i < 5 + salt % 7; ++i) r.prompt.push_back((i * 31 + salt * 17 + 3) % 256);
  r.max_tokens = max_tokens;
  r.settings.sampling.temperature = temperature;
  r.settings.sampling.seed = 40 + static_cast<uint64_t>(salt);
  r.settings.ignore_eos = true;
  return r;
}

struct Collected {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::string> text;
  std::vector<llm::FinishReason> finish;
  std::vector<TokenLogprob> logprobs;
};

Collected drain(GenerationStream& s, int n = 1) {
  Collected c;
  c.tokens.resize(static_cast<size_t>(n));
  c.text.resize(static_cast<size_t>(n));
  c.finish.resize(static_cast<size_t>(n), llm::FinishReason::none);
  GenerationDelta d;
  while (s.next(d)) {
    const auto i = static_cast<size_t>(d.index);
    EXPECT_EQ(c.finish[i], llm::FinishReason::none) << "delta after the finish of index " << i;
    c.tokens[i].insert(c.tokens[i].end(), d.tokens.begin(), d.tokens.end());
    c.text[i] += d.text;
    c.finish[i] = d.finish;
    for (auto& lp : d.logprobs) c.logprobs.push_back(lp);
  }
  return c;
}

template <class F>
bool eventually(F condition) {
  for (int i = 0; i < 2000; ++i) {
    if (condition()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return condition();
}

TEST(Service, ConcurrentRequestsFromManyThreadsEachEqualTheEngineAlone) {
  constexpr int kRequests = 12;
  std::vector<llm::GenerationResult> alone;  // first: the model serves one thread at a time
  for (int i = 0; i < kRequests; ++i) alone.push_back(fixture().alone(request(i, 6 + i, i % 2 ? 0.8 : 0.0)));
  auto service = fixture().service();
  std::vector<Collected> got(kRequests);
  std::vector<std::thread> clients;
  for (int i = 0; i < kRequests; ++i)
    clients.emplace_back([&, i] {
      auto stream = service->submit(request(i, 6 + i, i % 2 ? 0.8 : 0.0));
      EXPECT_EQ(stream->prompt_tokens(), static_cast<int64_t>(request(i, 1).prompt.size()));
      got[static_cast<size_t>(i)] = drain(*stream);
    });
  for (auto& t : clients) t.join();
  for (int i = 0; i < kRequests; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(got[static_cast<size_t>(i)].tokens[0], alone[static_cast<size_t>(i)].token_ids);
    EXPECT_EQ(got[static_cast<size_t>(i)].text[0], alone[static_cast<size_t>(i)].text);
    EXPECT_EQ(got[static_cast<size_t>(i)].finish[0], llm::FinishReason::length);
  }
  EXPECT_TRUE(eventually([&] { return service->in_flight() == 0; }));
}

TEST(Service, NChoicesUseSeedPlusIndex) {
  SubmitRequest r = request(3, 9, 100.0);
  r.settings.n = 3;
  std::vector<std::vector<int32_t>> alone;
  for (int i = 0; i < 3; ++i) alone.push_back(fixture().alone(r, i).token_ids);
  auto service = fixture().service();
  auto stream = service->submit(r);
  const Collected c = drain(*stream, 3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(c.tokens[static_cast<size_t>(i)], alone[static_cast<size_t>(i)]) << i;
  EXPECT_NE(c.tokens[0], c.tokens[1]);
}

TEST(Service, LogprobsAreTheLogSoftmaxOfTheLogitsAtTheTemperature) {
  auto service = fixture().service();
  SubmitRequest r = request(5, 6, 0.7);
  r.settings.logprobs = true;
  r.settings.top_logprobs = 4;
  auto rows = std::make_shared<std::vector<std::vector<float>>>();
  r.logits_processor = [rows](std::span<float> logits, std::span<const int32_t>) {
    rows->emplace_back(logits.begin(), logits.end());
  };
  auto stream = service->submit(r);
  const Collected c = drain(*stream);
  ASSERT_EQ(c.logprobs.size(), 6u);
  ASSERT_EQ(rows->size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    double z = 0;
    for (float l : (*rows)[i]) z += std::exp(l / 0.7);
    const auto& lp = c.logprobs[i];
    EXPECT_EQ(lp.token, c.tokens[0][i]);
    EXPECT_NEAR(lp.logprob, (*rows)[i][static_cast<size_t>(lp.token)] / 0.7 - std::log(z), 1e-4);
    ASSERT_EQ(lp.top.size(), 4u);
    for (size_t k = 0; k < 4; ++k) {
      EXPECT_NEAR(lp.top[k].second, (*rows)[i][static_cast<size_t>(lp.top[k].first)] / 0.7 - std::log(z),
                  1e-4);
      if (k > 0) {
        EXPECT_GE(lp.top[k - 1].second, lp.top[k].second);
      }
    }
  }
}

TEST(Service, CancellingOrDroppingAStreamFreesItsBlocksWhileOthersGoOn) {
  const SubmitRequest other = request(8, 40);
  const llm::GenerationResult other_alone = fixture().alone(other);  // the model serves one thread at a time
  auto service = fixture().service();
  auto other_stream = service->submit(other);
  auto long_a = service->submit(request(1, 100000));
  auto long_b = service->submit(request(2, 100000));
  GenerationDelta d;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(long_a->next(d));
  ASSERT_TRUE(long_b->next(d));
  EXPECT_GT(service->gauges().kv_blocks_used, 0);
  long_a->cancel();
  EXPECT_FALSE(long_a->next(d)) << "a cancelled stream ends";
  long_b.reset();  // a client that left
  const Collected c = drain(*other_stream);
  EXPECT_EQ(c.tokens[0], other_alone.token_ids);
  EXPECT_TRUE(eventually([&] {
    const EngineGauges g = service->gauges();
    return g.running == 0 && g.kv_blocks_used == 0 && g.queue_depth == 0;
  }));
  EXPECT_TRUE(eventually([&] { return service->in_flight() == 0; }));
}

TEST(Service, AFullQueueAnswers429AndFreesUpAgain) {
  auto service = fixture().service(/*max_running=*/1, /*max_queue=*/1);
  auto a = service->submit(request(1, 100000));
  auto b = service->submit(request(2, 100000));
  try {
    service->submit(request(3, 4));
    FAIL() << "a third request must be refused";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 429);
    EXPECT_NE(std::string(e.what()).find("--max-queue 1"), std::string::npos) << e.what();
  }
  SubmitRequest two = request(4, 4);
  two.settings.n = 2;
  a.reset();
  b.reset();
  ASSERT_TRUE(eventually([&] { return service->in_flight() == 0; }));
  auto c = service->submit(two);
  EXPECT_EQ(drain(*c, 2).finish[1], llm::FinishReason::length);
}

TEST(Service, RequestsBeyondTheContextAreRefusedNamingTheLimit) {
  auto service = fixture().service(8, 8, /*max_seq_len=*/32);
  SubmitRequest r = request(0, 30);
  try {
    service->submit(r);
    FAIL();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.param, "max_tokens");
    EXPECT_NE(std::string(e.what()).find("maximum context length is 32 tokens"), std::string::npos)
        << e.what();
  }
  r.prompt.assign(40, 7);
  try {
    service->submit(r);
    FAIL();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_NE(std::string(e.what()).find("the prompt has 40 tokens"), std::string::npos) << e.what();
  }
  r.prompt = {1, 999};
  EXPECT_THROW(service->submit(r), ApiError);
  r = request(0, 0);  // max_tokens 0: up to the context
  auto s = service->submit(r);
  EXPECT_EQ(static_cast<int64_t>(drain(*s).tokens[0].size()) + s->prompt_tokens(), 32);
}

TEST(Service, ARequestWhoseProcessingFailsFailsAlone) {
  auto service = fixture().service();
  SubmitRequest bad = request(6, 20, 0.9);
  bad.logits_processor = [](std::span<float> logits, std::span<const int32_t> generated) {
    if (generated.size() == 2) std::fill(logits.begin(), logits.end(), -INFINITY);
  };
  const SubmitRequest good = request(7, 20);
  const llm::GenerationResult good_alone = fixture().alone(good);
  auto bad_stream = service->submit(bad);
  auto good_stream = service->submit(good);
  GenerationDelta d;
  int tokens = 0;
  try {
    while (bad_stream->next(d)) tokens += static_cast<int>(d.tokens.size());
    FAIL() << "the failed request's stream must throw";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 500);
    EXPECT_NE(std::string(e.what()).find("every logit is -inf"), std::string::npos) << e.what();
  }
  EXPECT_EQ(tokens, 2);
  EXPECT_EQ(drain(*good_stream).tokens[0], good_alone.token_ids);
  EXPECT_TRUE(eventually([&] { return service->in_flight() == 0 && service->gauges().kv_blocks_used == 0; }));
}

TEST(Service, ShutdownFailsWhatIsStillRunningAndRefusesNewRequests) {
  ServerMetrics metrics;
  auto service = fixture().service(8, 8, 1 << 20, &metrics);
  auto running = service->submit(request(1, 100000));
  GenerationDelta d;
  ASSERT_TRUE(running->next(d));
  service->shutdown(std::chrono::milliseconds(20));
  try {
    while (running->next(d)) {
    }
    FAIL();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 503);
  }
  EXPECT_THROW(service->submit(request(2, 3)), ApiError);
  const std::string text = metrics.render(service->gauges());
  EXPECT_NE(text.find("xmoe_prompt_tokens_total " + std::to_string(running->prompt_tokens())),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("xmoe_kv_cache_blocks_used 0\n"), std::string::npos) << text;
}

}  // namespace
}  // namespace xmoe::serve
