// The HTTP front of `xmoe serve`, on cpp-httplib (Debian libcpp-httplib-dev): routes to handlers that return
// ApiResponses (a body, or a stream written through a StreamWriter that flushes each piece and reports a
// client that left), API-key auth, 404/405/413 in each API's error shape, one access-log line per request and
// per-route request counters. No HTTP parsing of our own.
#pragma once
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "serve/api.hpp"
#include "serve/backend.hpp"
#include "serve/metrics.hpp"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace xmoe::serve {

struct Route {
  std::string method;  // "GET", "POST"
  std::string path;    // exact
  bool open = false;   // served without the API key (/health, the web page)
  // The backend is the server's, wrapped per request so the access log can count its tokens.
  std::function<ApiResponse(std::string_view body, Backend& backend)> handle;
};

// The error body of the API that owns `path` (e.g. Anthropic for /v1/messages*, OpenAI otherwise).
using ErrorRenderer = std::function<ApiResponse(std::string_view path, const ApiError& error)>;

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;      // 0: any free port
  std::string api_key;  // empty: no auth
  size_t max_body_bytes = size_t{32} << 20;
  int threads = 64;                     // connections served at once (each stream holds one)
  size_t keep_alive_max_count = 10000;  // requests per kept-alive connection
  int keep_alive_timeout_s = 5;
  std::FILE* access_log = stderr;  // null: none
};

class HttpServer {
 public:
  HttpServer(HttpServerOptions options, std::vector<Route> routes, ErrorRenderer errors, Backend& backend,
             ServerMetrics* metrics);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds the socket; returns the port (the one picked when options.port is 0). Throws xmoe::Error.
  int bind();
  // Serves until stop(); in-flight requests finish first.
  void run();
  // Stops accepting; callable from any thread.
  void stop();

  struct RequestRecord;  // one request's start time, route and token counts (for the access log)

 private:
  bool authorized(const httplib::Request& req) const;
  void handle(const Route& route, const httplib::Request& req, httplib::Response& res);
  void render_error(std::string_view path, const ApiError& error, httplib::Response& res) const;
  void on_error(const httplib::Request& req, httplib::Response& res);
  void log(const httplib::Request& req, const httplib::Response& res);
  std::shared_ptr<RequestRecord> record_of(const httplib::Request& req);

  HttpServerOptions options_;
  std::vector<Route> routes_;
  ErrorRenderer errors_;
  Backend& backend_;
  ServerMetrics* metrics_;
  std::unique_ptr<httplib::Server> server_;
  std::mutex records_mu_;
  std::map<const httplib::Request*, std::shared_ptr<RequestRecord>> records_;
};

}  // namespace xmoe::serve
