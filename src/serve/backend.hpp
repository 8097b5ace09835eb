// What the protocol adapters (OpenAI, Anthropic, /chat) need from the serving runtime: the loaded model's
// facts and a way to run generations. The runtime (service.*) implements it over one engine driven by one
// thread; tests implement it with scripted text. (Contract between the adapters and the runtime.)
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "llm/chat_setup.hpp"
#include "llm/engine.hpp"
#include "llm/model_config.hpp"
#include "serve/chat_request.hpp"
#include "serve/json_constraint.hpp"
#include "serve/output_parser.hpp"
#include "xmoe/tokenizer.hpp"

namespace xmoe::serve {

// A request the server refuses: the adapters turn it into their API's error shape and status.
// type is OpenAI-style ("invalid_request_error", "authentication_error", "not_found_error",
// "rate_limit_error"/"overloaded_error", "server_error"); param names the offending field when there is one.
struct ApiError : std::runtime_error {
  int status;
  std::string type, param;
  ApiError(int status_, std::string type_, const std::string& message, std::string param_ = {})
      : std::runtime_error(message), status(status_), type(std::move(type_)), param(std::move(param_)) {}
};

struct ModelInfo {
  std::string served_name;  // what /v1/models lists and responses echo when the request names none
  int64_t max_seq_len = 0;  // prompt + generated tokens per sequence
  int64_t created = 0;      // unix time the model was loaded
  const llm::ModelConfig* config = nullptr;
  const llm::ChatSetup* chat = nullptr;
  const Tokenizer* tokenizer = nullptr;
  OutputFormat output_format = OutputFormat::plain;
  GenerationSettings defaults;  // generation_config.json sampling, server max tokens
  // Every token's text for forced JSON (make_token_texts(*tokenizer), built once at load; when null the
  // adapters build it per request that needs it).
  std::shared_ptr<const TokenTexts> token_texts;
  // The chat template parsed once at load (parse_chat_template(*chat)); when null, each request parses it.
  std::shared_ptr<const ChatTemplate> chat_template;
};

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;  // the most likely tokens at this position, best first
};

struct SubmitRequest {
  std::vector<int32_t> prompt;
  GenerationSettings settings;  // n sequences, sampling, stop strings, logprobs; seed + i for choice i
  int64_t max_tokens = 0;       // resolved by the adapter (>= 1, prompt + max_tokens <= max_seq_len)
  std::vector<int32_t> stop_token_ids;
  // Optional per-token constraint (e.g. forced JSON): edits one sequence's logits row before sampling,
  // given the tokens that sequence generated so far. Called on the engine thread; must not throw.
  std::function<void(std::span<float> logits, std::span<const int32_t> generated)> logits_processor;
};

struct GenerationDelta {
  int index = 0;                       // which of the request's n sequences
  std::string text;                    // new text (complete UTF-8, stop strings removed)
  std::vector<int32_t> tokens;         // tokens generated since the previous delta of this index
  std::vector<TokenLogprob> logprobs;  // one per token when settings.logprobs
  llm::FinishReason finish = llm::FinishReason::none;  // set on the last delta of this index
  std::string stop_string;                             // the stop string that ended it, if any
};

class GenerationStream {
 public:
  virtual ~GenerationStream() = default;  // cancels what is still running
  int64_t prompt_tokens() const { return prompt_tokens_; }
  // Blocks until the next delta of any index; false once every index has delivered its finish.
  virtual bool next(GenerationDelta& out) = 0;
  // Stops generating (a client that left); the sequence's KV blocks are freed at the engine's next step.
  virtual void cancel() = 0;

 protected:
  int64_t prompt_tokens_ = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const ModelInfo& info() const = 0;
  // Queues the request; throws ApiError 429 (queue full; Anthropic answers 529 overloaded_error) or 400
  // (a prompt longer than the context, naming the limit).
  virtual std::unique_ptr<GenerationStream> submit(SubmitRequest request) = 0;
};

}  // namespace xmoe::serve
