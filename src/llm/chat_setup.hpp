// What a checkpoint directory says about turning a conversation into prompt ids and about when to stop:
// tokenizer_config.json (chat_template, bos_token, eos_token), chat_template.jinja, generation_config.json
// (eos_token_id, sampling defaults), as transformers reads them.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "llm/engine.hpp"
#include "llm/model_config.hpp"
#include "llm/sampler.hpp"
#include "xmoe/tokenizer.hpp"

namespace xmoe::llm {

struct ChatSetup {
  std::optional<std::string> chat_template;  // template source
  std::string chat_template_origin;          // file it came from (for error messages)
  std::string bos_token, eos_token;          // token strings ("" when not set)
  // Every id that ends generation: config.json eos_token_id, generation_config.json eos_token_id and the
  // tokenizer's id of eos_token, without duplicates.
  std::vector<int32_t> eos_token_ids;
  // generation_config.json sampling defaults (do_sample false → temperature 0); absent fields stay unset.
  std::optional<double> temperature, top_p, min_p, repetition_penalty;
  std::optional<int> top_k;
};

// Reads dir's tokenizer_config.json, chat_template.jinja and generation_config.json, each optional. A
// chat_template.jinja file takes precedence over tokenizer_config.json's "chat_template" (as in
// transformers); that field may be a string or a list of {"name", "template"} (the "default" one is used).
// Throws xmoe::Error naming the file and field when one is malformed.
ChatSetup load_chat_setup(const std::string& dir, const ModelConfig& config, const Tokenizer* tokenizer);

struct ChatPromptOptions {
  std::optional<std::string> system;
  std::string user;
  bool add_generation_prompt = true;
  std::optional<bool> enable_thinking;  // absent: the template's default
};

// Renders messages = [system?, user] with the chat template (bos_token, eos_token, add_generation_prompt and
// enable_thinking in the context). Throws when the checkpoint has no chat template.
std::string render_chat_prompt(const ChatSetup& setup, const ChatPromptOptions& options);

// Fills the fields of `params` that generation_config.json sets (for a CLI whose flags were not given).
void apply_generation_defaults(const ChatSetup& setup, SamplingParams& params);

// An engine TextStream over the tokenizer's UTF-8-safe StreamDecoder (special tokens skipped, as vLLM's
// default skip_special_tokens does).
// skip_special_tokens false keeps markup that is made of special tokens (gpt-oss's harmony <|channel|> …) for
// the output parser to read.
TextStreamFactory tokenizer_text_stream(const Tokenizer& tokenizer, bool skip_special_tokens = true);

}  // namespace xmoe::llm
