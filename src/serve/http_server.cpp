#include "serve/http_server.hpp"

#include <httplib.h>

#include <atomic>
#include <ctime>
#include <regex>

#include "xmoe/error.hpp"

namespace xmoe::serve {

using Clock = std::chrono::steady_clock;

struct HttpServer::RequestRecord {
  Clock::time_point start = Clock::now();
  std::string route;  // the matched route's path; empty when none matched
  std::atomic<int64_t> prompt_tokens{-1}, completion_tokens{0};
};

namespace {

// Counts what a request's generations used, for the access log (the stream may outlive the handler).
class CountingStream final : public GenerationStream {
 public:
  CountingStream(std::unique_ptr<GenerationStream> inner, std::shared_ptr<HttpServer::RequestRecord> record)
      : inner_(std::move(inner)), record_(std::move(record)) {
    prompt_tokens_ = inner_->prompt_tokens();
  }
  bool next(GenerationDelta& out) override {
    const bool more = inner_->next(out);
    if (more) record_->completion_tokens += static_cast<int64_t>(out.tokens.size());
    return more;
  }
  void cancel() override { inner_->cancel(); }

 private:
  std::unique_ptr<GenerationStream> inner_;
  std::shared_ptr<HttpServer::RequestRecord> record_;
};

class CountingBackend final : public Backend {
 public:
  CountingBackend(Backend& inner, std::shared_ptr<HttpServer::RequestRecord> record)
      : inner_(inner), record_(std::move(record)) {}
  const ModelInfo& info() const override { return inner_.info(); }
  std::unique_ptr<GenerationStream> submit(SubmitRequest request) override {
    auto stream = inner_.submit(std::move(request));
    int64_t expected = -1;
    const int64_t n = stream->prompt_tokens();
    if (!record_->prompt_tokens.compare_exchange_strong(expected, n)) record_->prompt_tokens += n;
    return std::make_unique<CountingStream>(std::move(stream), record_);
  }

 private:
  Backend& inner_;
  std::shared_ptr<HttpServer::RequestRecord> record_;
};

class SinkWriter final : public StreamWriter {
 public:
  explicit SinkWriter(httplib::DataSink& sink) : sink_(sink) {}
  bool write(std::string_view chunk) override {
    if (!sink_.is_writable()) return false;
    return sink_.write(chunk.data(), chunk.size());
  }

 private:
  httplib::DataSink& sink_;
};

std::string regex_escape(const std::string& path) {
  static const std::regex special(R"([.^$|()\[\]{}*+?\\])");
  return std::regex_replace(path, special, R"(\$&)");
}

// Constant-time comparison, so the key cannot be guessed byte by byte from response times.
bool same_secret(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  return diff == 0;
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace

HttpServer::HttpServer(HttpServerOptions options, std::vector<Route> routes, ErrorRenderer errors,
                       Backend& backend, ServerMetrics* metrics)
    : options_(std::move(options)),
      routes_(std::move(routes)),
      errors_(std::move(errors)),
      backend_(backend),
      metrics_(metrics),
      server_(std::make_unique<httplib::Server>()) {
  XMOE_CHECK(options_.threads >= 1, "serve: HTTP threads must be >= 1, got ", options_.threads);
  const auto threads = static_cast<size_t>(options_.threads);
  server_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  server_->set_keep_alive_max_count(options_.keep_alive_max_count);
  server_->set_keep_alive_timeout(options_.keep_alive_timeout_s);
  server_->set_payload_max_length(options_.max_body_bytes);
  server_->set_tcp_nodelay(true);
  server_->set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    {
      std::lock_guard lock(records_mu_);
      records_[&req] = std::make_shared<RequestRecord>();  // replaces a record whose log line never came
    }
    if (authorized(req)) return httplib::Server::HandlerResponse::Unhandled;
    render_error(
        req.path,
        ApiError(401, "authentication_error",
                 "invalid or missing API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'"),
        res);
    return httplib::Server::HandlerResponse::Handled;
  });
  server_->set_error_handler(
      httplib::Server::HandlerWithResponse([this](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;  // a handler's own error
        on_error(req, res);
        return httplib::Server::HandlerResponse::Handled;
      }));
  server_->set_logger([this](const httplib::Request& req, const httplib::Response& res) { log(req, res); });
  for (const Route& route : routes_) {
    const Route* r = &route;
    auto handler = [this, r](const httplib::Request& req, httplib::Response& res) { handle(*r, req, res); };
    if (route.method == "GET") {
      server_->Get(regex_escape(route.path), handler);
    } else if (route.method == "POST") {
      server_->Post(regex_escape(route.path), handler);
    } else {
      XMOE_CHECK(false, "serve: route ", route.path, " has an unsupported method ", route.method);
    }
  }
}

HttpServer::~HttpServer() = default;

int HttpServer::bind() {
  if (options_.port == 0) {
    const int port = server_->bind_to_any_port(options_.host);
    XMOE_CHECK(port > 0, "serve: cannot listen on ", options_.host, " (no free port?)");
    return port;
  }
  XMOE_CHECK(server_->bind_to_port(options_.host, options_.port), "serve: cannot listen on ", options_.host,
             ":", options_.port, " (address in use, or not an address of this machine?)");
  return options_.port;
}

void HttpServer::run() {
  server_->listen_after_bind();
}

void HttpServer::stop() {
  server_->stop();
}

bool HttpServer::authorized(const httplib::Request& req) const {
  if (options_.api_key.empty()) return true;
  for (const Route& r : routes_)
    if (r.open && r.path == req.path && r.method == req.method) return true;
  const std::string bearer = req.get_header_value("Authorization");
  constexpr std::string_view kBearer = "Bearer ";
  if (bearer.size() > kBearer.size() && bearer.compare(0, kBearer.size(), kBearer) == 0 &&
      same_secret(std::string_view(bearer).substr(kBearer.size()), options_.api_key))
    return true;
  return req.has_header("x-api-key") && same_secret(req.get_header_value("x-api-key"), options_.api_key);
}

std::shared_ptr<HttpServer::RequestRecord> HttpServer::record_of(const httplib::Request& req) {
  std::lock_guard lock(records_mu_);
  auto& record = records_[&req];
  if (!record) record = std::make_shared<RequestRecord>();
  return record;
}

void HttpServer::render_error(std::string_view path, const ApiError& error, httplib::Response& res) const {
  const ApiResponse r = errors_(path, error);
  res.status = r.status;
  res.set_content(r.body, r.content_type);
}

void HttpServer::handle(const Route& route, const httplib::Request& req, httplib::Response& res) {
  const std::shared_ptr<RequestRecord> record = record_of(req);
  record->route = route.path;
  auto backend = std::make_shared<CountingBackend>(backend_, record);
  ApiResponse r;
  try {
    r = route.handle(req.body, *backend);
  } catch (const ApiError& e) {
    render_error(req.path, e, res);
    return;
  } catch (const std::exception& e) {
    render_error(req.path, ApiError(500, "server_error", std::string("internal error: ") + e.what()), res);
    return;
  }
  res.status = r.status;
  if (!r.stream) {
    res.set_content(r.body, r.content_type);
    return;
  }
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  // The whole stream is produced in one call: each write goes to the socket as one chunk at once.
  res.set_chunked_content_provider(r.content_type,
                                   [stream = std::move(r.stream), backend](size_t, httplib::DataSink& sink) {
                                     SinkWriter writer(sink);
                                     try {
                                       stream(writer);
                                     } catch (const std::exception&) {
                                       // The status line is sent; all that is left is to end the body.
                                     }
                                     sink.done();
                                     return true;
                                   });
}

void HttpServer::on_error(const httplib::Request& req, httplib::Response& res) {
  if (res.status == 404) {
    std::string allow;
    for (const Route& r : routes_)
      if (r.path == req.path) allow += (allow.empty() ? "" : ", ") + r.method;
    if (!allow.empty()) {
      res.set_header("Allow", allow);
      render_error(
          req.path,
          ApiError(405, "invalid_request_error",
                   "method " + req.method + " is not allowed on " + req.path + " (allowed: " + allow + ")"),
          res);
    } else {
      render_error(req.path, ApiError(404, "not_found_error", "no route " + req.method + " " + req.path),
                   res);
    }
  } else if (res.status == 413) {
    render_error(req.path,
                 ApiError(413, "request_too_large",
                          "the request body is larger than this server's limit of " +
                              std::to_string(options_.max_body_bytes) + " bytes (--max-body-mb)"),
                 res);
  } else if (res.status < 500) {
    const int status = res.status;
    render_error(req.path,
                 ApiError(status, "invalid_request_error",
                          "malformed HTTP request (status " + std::to_string(status) + ")"),
                 res);
    res.status = status;
  } else {
    render_error(req.path, ApiError(res.status, "server_error", "internal server error"), res);
  }
}

void HttpServer::log(const httplib::Request& req, const httplib::Response& res) {
  std::shared_ptr<RequestRecord> record;
  {
    std::lock_guard lock(records_mu_);
    auto it = records_.find(&req);
    if (it != records_.end()) {
      record = std::move(it->second);
      records_.erase(it);
    }
  }
  // Requests refused before routing (401, 413) count under their path when it is a route's.
  std::string route = record ? record->route : std::string();
  for (size_t i = 0; route.empty() && i < routes_.size(); ++i)
    if (routes_[i].path == req.path) route = req.path;
  if (route.empty()) route = "unmatched";
  if (metrics_) metrics_->count_request(route, res.status);
  if (!options_.access_log) return;
  std::string line = utc_now() + " " + req.remote_addr + " \"" + req.method + " " + req.path + "\" " +
                     std::to_string(res.status);
  if (record) {
    char ms[32];
    std::snprintf(ms, sizeof ms, " %.1fms",
                  std::chrono::duration<double, std::milli>(Clock::now() - record->start).count());
    line += ms;
    if (record->prompt_tokens >= 0)
      line += " prompt_tokens=" + std::to_string(record->prompt_tokens.load()) +
              " completion_tokens=" + std::to_string(record->completion_tokens.load());
  }
  line += "\n";
  std::fwrite(line.data(), 1, line.size(), options_.access_log);
  std::fflush(options_.access_log);
}

}  // namespace xmoe::serve
