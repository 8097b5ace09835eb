// Reading an Anthropic Messages body into a ChatRequest (400 errors name the field).
#pragma once
#include <nlohmann/json.hpp>

#include "serve/backend.hpp"
#include "serve/chat_request.hpp"

namespace xmoe::serve {

// Starts from the server's defaults; unknown fields are ignored, never rejected (Claude Code's gateway
// contract). max_tokens is required unless `for_count_tokens`.
ChatRequest parse_anthropic_request(const nlohmann::ordered_json& body, const ModelInfo& info,
                                    bool for_count_tokens = false);

}  // namespace xmoe::serve
