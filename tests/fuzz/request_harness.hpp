// The server's chat path up to the engine, for the request-body fuzz targets: body text → JSON → the API's
// request parser → prepare_chat (chat template, tokenizer, context limit, forced-JSON and thinking-budget
// processors), against a model with a real chat template (Qwen3) and vocabulary (Qwen2's tokenizer fixture).
// Refusals must be 4xx ApiErrors naming the field; any other exception or a 5xx escapes and fails the target.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_support.hpp"
#include "llm/chat_setup.hpp"
#include "serve/adapter_common.hpp"
#include "serve/backend.hpp"
#include "serve/json_constraint.hpp"
#include "xmoe/tokenizer.hpp"

namespace xmoe::fuzz {

class PrepareOnlyBackend final : public serve::Backend {
 public:
  PrepareOnlyBackend() : tokenizer_(Tokenizer::from_file(data_path("tokenizer/qwen2/tokenizer.json"))) {
    chat_.chat_template = read_file(data_path("chat_templates/Qwen-Qwen3-0.6B.jinja"));
    chat_.chat_template_origin = "Qwen-Qwen3-0.6B.jinja";
    chat_.eos_token = "<|im_end|>";
    info_.served_name = "fuzz";
    info_.max_seq_len = 4096;
    info_.chat = &chat_;
    info_.tokenizer = &tokenizer_;
    info_.output_format = serve::OutputFormat::qwen3;
    info_.defaults.max_tokens = 256;
    info_.token_texts = serve::make_token_texts(tokenizer_);
  }
  const serve::ModelInfo& info() const override { return info_; }
  // prepare_chat never submits; the harness stops before the engine.
  std::unique_ptr<serve::GenerationStream> submit(serve::SubmitRequest) override {
    throw std::logic_error("PrepareOnlyBackend: the fuzz harness does not generate");
  }

 private:
  Tokenizer tokenizer_;
  llm::ChatSetup chat_;
  serve::ModelInfo info_;
};

// Parses `body` with `parse` (body JSON → ChatRequest) and prepares it; then runs the logits processor once,
// as the engine would on the first step.
template <typename Parse>
void run_chat_request(std::string_view body, Parse&& parse) {
  static PrepareOnlyBackend backend;
  try {
    const serve::adapter::ojson j = serve::adapter::parse_body(body);
    const serve::ChatRequest request = parse(j, backend.info());
    serve::adapter::PreparedChat p = serve::adapter::prepare_chat(request, backend);
    if (p.submit.logits_processor) {
      std::vector<float> logits(static_cast<size_t>(backend.info().tokenizer->vocab_size()), 0.0f);
      p.submit.logits_processor(logits, {});
    }
  } catch (const serve::ApiError& e) {
    if (e.status >= 500) {
      std::fprintf(stderr, "request fuzz target: %d %s: %s\n", e.status, e.type.c_str(), e.what());
      std::abort();
    }
  }
}

}  // namespace xmoe::fuzz
