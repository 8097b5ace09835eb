// Reading an OpenAI chat-completions body into a ChatRequest (400 errors name the field).
#pragma once
#include <nlohmann/json.hpp>

#include "serve/backend.hpp"
#include "serve/chat_request.hpp"

namespace xmoe::serve {

// Starts from the server's defaults (info.defaults); unknown fields are ignored.
ChatRequest parse_openai_chat_request(const nlohmann::ordered_json& body, const ModelInfo& info);

}  // namespace xmoe::serve
