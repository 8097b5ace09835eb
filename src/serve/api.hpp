// The HTTP-independent face of each API: a request body in, a status and a body (or an SSE stream) out.
// The HTTP server (http_server.*) routes to these; tests call them directly with a scripted Backend.
#pragma once
#include <functional>
#include <string>
#include <string_view>

#include "serve/backend.hpp"

namespace xmoe::serve {

class StreamWriter {
 public:
  virtual ~StreamWriter() = default;
  // Sends one piece of the body now (an SSE event, a text piece); false when the client has gone, after
  // which the producer cancels its generation and returns.
  virtual bool write(std::string_view chunk) = 0;
};

struct ApiResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;                           // when stream is empty
  std::function<void(StreamWriter&)> stream;  // when set: produces the body (SSE or text) as it generates
};

// Each handler validates first (so errors get their status before any byte is streamed), then submits.
// Errors come back as responses in the API's own shape, never as exceptions.
ApiResponse openai_chat_completions(std::string_view body, Backend& backend);
ApiResponse openai_completions(std::string_view body, Backend& backend);
ApiResponse openai_models(Backend& backend);
ApiResponse anthropic_messages(std::string_view body, Backend& backend);
ApiResponse anthropic_count_tokens(std::string_view body, Backend& backend);
// Tutel's POST /chat: {"text": "...", optional sampling fields} → the answer streamed as plain text.
ApiResponse tutel_chat(std::string_view body, Backend& backend);

// Error bodies in each API's shape (for the HTTP layer's 401/404/405/413 and the handlers' own errors).
ApiResponse openai_error(const ApiError& error);
ApiResponse anthropic_error(const ApiError& error);

}  // namespace xmoe::serve
