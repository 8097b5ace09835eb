// Tutel's POST /chat: {"text": "...", optional sampling fields} → the model's output streamed as plain text.
#include "serve/adapter_common.hpp"
#include "serve/api.hpp"

namespace xmoe::serve {

using adapter::ojson;

namespace {

ApiResponse chat(std::string_view body, Backend& backend) {
  const ojson j = adapter::parse_body(body);
  const ModelInfo& info = backend.info();
  ChatRequest request;
  request.generation = info.defaults;
  const auto text = adapter::opt_string(j, "text", "");
  if (!text) throw adapter::bad_request("text", "text is required");
  request.messages.push_back(ChatMessage{Role::user, *text, "", {}, "", ""});
  adapter::read_sampling(j, request.generation.sampling);
  if (auto v = adapter::opt_integer(j, "max_tokens", "")) {
    if (*v < 1) throw adapter::bad_request("max_tokens", "max_tokens must be >= 1");
    request.generation.max_tokens = *v;
  }
  request.generation.stop = adapter::read_stop(j, "stop");
  if (auto t = adapter::opt_bool(j, "enable_thinking", "")) request.enable_thinking = *t;
  adapter::PreparedChat p = adapter::prepare_chat(request, backend);
  std::shared_ptr<GenerationStream> stream = backend.submit(std::move(p.submit));
  ApiResponse r;
  r.content_type = "text/plain; charset=utf-8";
  // The text as the model writes it (thinking markup included), as Tutel's endpoint streams it.
  r.stream = [stream](StreamWriter& w) {
    try {
      GenerationDelta d;
      while (stream->next(d)) {
        if (!d.text.empty() && !w.write(d.text)) {
          stream->cancel();
          return;
        }
      }
    } catch (const std::exception& e) {
      w.write(std::string("\n[error: ") + e.what() + "]\n");
    }
  };
  return r;
}

}  // namespace

ApiResponse tutel_chat(std::string_view body, Backend& backend) {
  try {
    return chat(body, backend);
  } catch (const ApiError& e) {
    return openai_error(e);
  } catch (const std::exception& e) {
    return openai_error(ApiError(500, "server_error", std::string("internal error: ") + e.what()));
  }
}

}  // namespace xmoe::serve
