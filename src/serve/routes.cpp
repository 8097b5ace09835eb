#include "serve/routes.hpp"

namespace xmoe::serve {

namespace {

ApiResponse text(std::string body, std::string content_type) {
  ApiResponse r;
  r.body = std::move(body);
  r.content_type = std::move(content_type);
  return r;
}

}  // namespace

std::vector<Route> server_routes(ServerMetrics& metrics, std::function<EngineGauges()> gauges,
                                 std::string_view web_page) {
  std::vector<Route> routes = {
      {"POST", "/v1/chat/completions", false, openai_chat_completions},
      {"POST", "/v1/completions", false, openai_completions},
      {"GET", "/v1/models", false, [](std::string_view, Backend& b) { return openai_models(b); }},
      {"POST", "/v1/messages", false, anthropic_messages},
      {"POST", "/v1/messages/count_tokens", false, anthropic_count_tokens},
      {"POST", "/chat", false, tutel_chat},
      {"GET", "/health", true,
       [](std::string_view, Backend&) { return text(R"({"status":"ok"})", "application/json"); }},
      {"GET", "/metrics", false,
       [&metrics, gauges](std::string_view, Backend&) {
         return text(metrics.render(gauges()), "text/plain; version=0.0.4; charset=utf-8");
       }},
  };
  if (!web_page.empty())
    routes.push_back({"GET", "/", true, [web_page](std::string_view, Backend&) {
                        return text(std::string(web_page), "text/html; charset=utf-8");
                      }});
  return routes;
}

ApiResponse api_error_for_path(std::string_view path, const ApiError& error) {
  return path.rfind("/v1/messages", 0) == 0 ? anthropic_error(error) : openai_error(error);
}

}  // namespace xmoe::serve
