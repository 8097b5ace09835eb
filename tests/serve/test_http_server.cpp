// The HTTP layer with scripted routes and a scripted backend, driven by cpp-httplib's client over loopback:
// auth by both header styles, 404/405/413 in the API's shape by path, streaming flushed piece by piece, a
// client that leaves mid-stream cancels its generation, the access log and the request counters.
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <thread>

#include "serve/http_server.hpp"

namespace xmoe::serve {
namespace {

using nlohmann::json;

struct Script {
  std::atomic<int> cancelled{0};
  std::atomic<int> streams{0};
};

// Endless deltas, one per millisecond, each one token.
class EndlessStream final : public GenerationStream {
 public:
  explicit EndlessStream(Script& s) : script_(s) { prompt_tokens_ = 7; }
  ~EndlessStream() override { cancel(); }
  bool next(GenerationDelta& out) override {
    if (cancelled_) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    out = GenerationDelta{};
    out.text = "tok" + std::to_string(count_++) + " ";
    out.tokens = {count_};
    return true;
  }
  void cancel() override {
    if (!cancelled_.exchange(true)) ++script_.cancelled;
  }

 private:
  Script& script_;
  std::atomic<bool> cancelled_{false};
  int count_ = 0;
};

class ScriptedBackend final : public Backend {
 public:
  explicit ScriptedBackend(Script& s) : script_(s) {}
  const ModelInfo& info() const override { return info_; }
  std::unique_ptr<GenerationStream> submit(SubmitRequest) override {
    ++script_.streams;
    return std::make_unique<EndlessStream>(script_);
  }

 private:
  Script& script_;
  ModelInfo info_;
};

std::vector<Route> routes() {
  std::vector<Route> r;
  r.push_back({"POST", "/v1/chat/completions", false, [](std::string_view body, Backend& backend) {
                 const int limit = json::parse(body).value("limit", -1);
                 std::shared_ptr<GenerationStream> stream = backend.submit({});
                 ApiResponse res;
                 res.content_type = "text/event-stream";
                 res.stream = [stream, limit](StreamWriter& w) {
                   GenerationDelta d;
                   for (int i = 0; (limit < 0 || i < limit) && stream->next(d); ++i)
                     if (!w.write("data: " + d.text + "\n\n")) {
                       stream->cancel();
                       return;
                     }
                 };
                 return res;
               }});
  r.push_back({"POST", "/v1/messages", false, [](std::string_view, Backend&) {
                 ApiResponse res;
                 res.body = R"({"ok":true})";
                 return res;
               }});
  r.push_back({"GET", "/health", true, [](std::string_view, Backend&) {
                 ApiResponse res;
                 res.body = R"({"status":"ok"})";
                 return res;
               }});
  return r;
}

ApiResponse render(std::string_view path, const ApiError& e) {
  ApiResponse r;
  r.status = e.status;
  r.body = json{{"family", path.rfind("/v1/messages", 0) == 0 ? "anthropic" : "openai"},
                {"type", e.type},
                {"message", e.what()}}
               .dump();
  return r;
}

class HttpServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    log_ = std::tmpfile();
    HttpServerOptions o;
    o.port = 0;
    o.api_key = "sekrit";
    o.max_body_bytes = 1000;
    o.threads = 8;
    o.access_log = log_;
    server_ = std::make_unique<HttpServer>(o, routes(), render, backend_, &metrics_);
    port_ = server_->bind();
    thread_ = std::thread([this] { server_->run(); });
  }
  void TearDown() override {
    server_->stop();
    thread_.join();
    std::fclose(log_);
  }
  httplib::Client client() {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(10, 0);
    return c;
  }
  std::string access_log() {
    std::fflush(log_);
    std::rewind(log_);
    std::string s;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, log_)) > 0) s.append(buf, n);
    return s;
  }

  Script script_;
  ScriptedBackend backend_{script_};
  ServerMetrics metrics_;
  std::FILE* log_ = nullptr;
  std::unique_ptr<HttpServer> server_;
  int port_ = 0;
  std::thread thread_;
};

TEST_F(HttpServerTest, EveryApiRouteNeedsTheKeyInEitherHeaderStyle) {
  auto c = client();
  auto r = c.Post("/v1/messages", "{}", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  EXPECT_EQ(json::parse(r->body)["family"], "anthropic");
  EXPECT_EQ(json::parse(r->body)["type"], "authentication_error");
  r = c.Post("/v1/chat/completions", R"({"limit":1})", "application/json");
  EXPECT_EQ(r->status, 401);
  EXPECT_EQ(json::parse(r->body)["family"], "openai");
  r = c.Post("/v1/messages", {{"x-api-key", "wrong"}}, "{}", "application/json");
  EXPECT_EQ(r->status, 401);
  r = c.Post("/v1/messages", {{"x-api-key", "sekrit"}, {"anthropic-version", "2099-01-01"}}, "{}",
             "application/json");
  EXPECT_EQ(r->status, 200);
  r = c.Post("/v1/messages", {{"Authorization", "Bearer sekrit"}}, "{}", "application/json");
  EXPECT_EQ(r->status, 200);
  r = c.Get("/health");
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(script_.streams, 0) << "nothing was generated for a refused request";
}

TEST_F(HttpServerTest, UnknownPathsWrongMethodsAndLargeBodiesAnswerInTheApisShape) {
  auto c = client();
  const httplib::Headers key = {{"x-api-key", "sekrit"}};
  auto r = c.Get("/v1/nope", key);
  EXPECT_EQ(r->status, 404);
  EXPECT_EQ(json::parse(r->body)["family"], "openai");
  EXPECT_EQ(json::parse(r->body)["type"], "not_found_error");
  r = c.Get("/v1/messages", key);
  EXPECT_EQ(r->status, 405);
  EXPECT_EQ(json::parse(r->body)["family"], "anthropic");
  EXPECT_EQ(r->get_header_value("Allow"), "POST");
  r = c.Post("/v1/messages", key, std::string(5000, ' '), "application/json");
  EXPECT_EQ(r->status, 413);
  EXPECT_EQ(json::parse(r->body)["type"], "request_too_large");
  EXPECT_NE(json::parse(r->body)["message"].get<std::string>().find("1000 bytes"), std::string::npos);
}

TEST_F(HttpServerTest, StreamsArriveAsTheyAreWrittenAndALeavingClientCancels) {
  auto c = client();
  const httplib::Headers key = {{"Authorization", "Bearer sekrit"}};
  auto r = c.Post("/v1/chat/completions", key, R"({"limit":5})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "data: tok0 \n\ndata: tok1 \n\ndata: tok2 \n\ndata: tok3 \n\ndata: tok4 \n\n");
  EXPECT_EQ(r->get_header_value("Content-Type"), "text/event-stream");

  // An endless stream the client abandons after three pieces.
  httplib::Client raw("127.0.0.1", port_);
  std::string body;
  int pieces = 0;
  httplib::Request post;
  post.method = "POST";
  post.path = "/v1/chat/completions";
  post.headers = key;
  post.body = R"({"limit":-1})";
  post.set_header("Content-Type", "application/json");
  post.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    body.append(data, n);
    return ++pieces < 3;
  };
  httplib::Response res;
  httplib::Error err;
  raw.send(post, res, err);
  EXPECT_GE(pieces, 3);
  EXPECT_EQ(body.rfind("data: tok0 \n\n", 0), 0u) << body;
  for (int i = 0; i < 2000 && script_.cancelled < 2; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(script_.cancelled, 2) << "the finished stream's and the abandoned stream's generations end";
}

TEST_F(HttpServerTest, AccessLogAndRequestCountersRecordEachRequest) {
  auto c = client();
  c.Post("/v1/chat/completions", {{"x-api-key", "sekrit"}}, R"({"limit":3})", "application/json");
  c.Get("/health");
  c.Get("/nowhere");
  c.Post("/v1/messages", "{}", "application/json");  // 401 before routing, counted under its route
  const std::string log = access_log();
  EXPECT_NE(log.find("\"POST /v1/chat/completions\" 200 "), std::string::npos) << log;
  EXPECT_NE(log.find("prompt_tokens=7 completion_tokens=3"), std::string::npos) << log;
  EXPECT_NE(log.find("\"GET /health\" 200"), std::string::npos) << log;
  EXPECT_NE(log.find("\"GET /nowhere\" 401"), std::string::npos) << log;
  const std::string text = metrics_.render({});
  EXPECT_NE(text.find("xmoe_http_requests_total{route=\"/v1/chat/completions\",status=\"200\"} 1"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("xmoe_http_requests_total{route=\"unmatched\",status=\"401\"} 1"), std::string::npos)
      << text;
  EXPECT_NE(text.find("xmoe_http_requests_total{route=\"/v1/messages\",status=\"401\"} 1"), std::string::npos)
      << text;
}

}  // namespace
}  // namespace xmoe::serve
