// An architecture of causal LM (Qwen3MoeForCausalLM, ...): everything xmoe knows about it in one object,
// found by config.json's `architectures` / `model_type` in the one registry (registry.cpp, fed by
// architectures.def). How to add one: /work/contracts/arch-kit.md (and the README).
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "llm/arch/config_fields.hpp"
#include "llm/arch/tensor_plan.hpp"
#include "llm/model.hpp"
#include "llm/model_config.hpp"

namespace xmoe::llm {

// A special token of the small byte-level tokenizer `init-model` writes next to random weights.
struct SpecialTokenSpec {
  std::string content;
  bool special = true;  // tokenizer.json's "special" (Qwen3's think/tool tags are added but not special)
};

// What `init-model` writes besides the weights: a model-independent byte-level BPE tokenizer configured by
// the architecture (its special tokens take the top ids), the chat template, and the token ids of
// config.json / generation_config.json.
struct InitModelSpec {
  std::vector<SpecialTokenSpec> special_tokens;
  std::string split_regex;      // the pre-tokenizer's Split pattern (the architecture's tokenizer family)
  std::string chat_template;    // tokenizer_config.json chat_template
  std::string tokenizer_class;  // tokenizer_config.json tokenizer_class
  std::string bos_token;        // content, or "" for none (tokenizer_config bos_token: null)
  std::string eos_token, pad_token;
  std::vector<std::string> additional_special_tokens;
  int64_t model_max_length = 131072;
  // config.json's bos/eos and generation_config.json's eos list and pad, as token contents.
  std::string config_bos, config_eos;
  std::vector<std::string> generation_eos;
  std::string generation_pad;
  nlohmann::ordered_json sampling;  // generation_config.json sampling defaults (do_sample, temperature, ...)
  double initializer_range = 0.02;  // std of the random weights (transformers' config default)
  // Write the vocabulary as tiktoken.model + tokenizer_config.json (Kimi-K2's format: its pattern, 256
  // reserved special ids after the vocabulary) instead of tokenizer.json; split_regex is then unused.
  bool tiktoken_vocabulary = false;
};

class Architecture {
 public:
  virtual ~Architecture() = default;
  virtual std::string_view name() const = 0;        // config.json architectures[0]
  virtual std::string_view model_type() const = 0;  // config.json model_type
  // Whether config.json's model_type `t` names this architecture (one class may serve several, as
  // DeepseekV3ForCausalLM serves deepseek_v3 and kimi_k2).
  virtual bool has_model_type(std::string_view t) const { return t == model_type(); }

  // Fills `c` (architecture and model_type already set) from config.json through the shared helpers of
  // config_fields.hpp, sets c.extension for fields of its own, and throws naming the field for what it does
  // not support or what contradicts itself.
  virtual void parse_config(const FieldReader& r, ModelConfig& c) const = 0;

  // Every tensor of a checkpoint of config `c`, named as the loader reads them (one name map for both).
  virtual std::vector<PlannedTensor> tensors(const ModelConfig& c, ExpertLayout layout) const = 0;

  // The model, reading the checkpoint's weights in place (see load_model).
  virtual std::unique_ptr<CausalLM> load(const Checkpoint& checkpoint, const LoadOptions& options) const = 0;

  // What `init-model` writes besides the weights for config `c` (one class may serve several model_types).
  virtual InitModelSpec init_model_spec(const ModelConfig& c) const = 0;
};

// The registered architectures, in registration order.
const std::vector<const Architecture*>& architectures();
const Architecture* find_architecture(std::string_view name);  // nullptr when unknown
const Architecture* find_architecture_by_model_type(std::string_view model_type);
// The architecture of a parsed config (throws naming it when unknown).
const Architecture& architecture_of(const ModelConfig& config);
std::string supported_architecture_names();  // "Qwen3MoeForCausalLM, ..."

}  // namespace xmoe::llm
