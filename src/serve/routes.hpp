// The routes of `xmoe serve`: the OpenAI, Anthropic and Tutel APIs over a Backend, /health, /metrics and the
// web page; and the error shape each path answers in (Anthropic under /v1/messages, OpenAI elsewhere).
#pragma once
#include <functional>
#include <string_view>
#include <vector>

#include "serve/http_server.hpp"
#include "serve/metrics.hpp"

namespace xmoe::serve {

// web_page: served at GET / when not empty (it must outlive the routes).
std::vector<Route> server_routes(ServerMetrics& metrics, std::function<EngineGauges()> gauges,
                                 std::string_view web_page);

ApiResponse api_error_for_path(std::string_view path, const ApiError& error);

}  // namespace xmoe::serve
