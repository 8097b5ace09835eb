// A small byte-level BPE tokenizer in Hugging Face's format for random-weight checkpoints: every id below the
// model's vocab_size decodes to something, so a model sampling any id still produces text. Model-independent:
// the architecture's InitModelSpec gives the special tokens, the pre-tokenizer split, the chat template and
// the tokenizer_config.json fields.
#pragma once
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "llm/arch/architecture.hpp"

namespace xmoe::app {

// 256 byte tokens + the special tokens.
inline int64_t min_byte_level_vocab(const llm::InitModelSpec& spec) {
  return 256 + static_cast<int64_t>(spec.special_tokens.size());
}

// Writes dir/tokenizer.json (NFC normalizer, Split with spec.split_regex + ByteLevel pre-tokenizer, BPE with
// the 256 byte tokens then merged tokens, ByteLevel decoder) and dir/tokenizer_config.json (spec's chat
// template and tokens). The special tokens take the top ids in spec order. Deterministic. Returns each
// special token's id by content. Requires vocab_size >= min_byte_level_vocab(spec).
std::map<std::string, int32_t> write_byte_level_tokenizer(const std::string& dir, int64_t vocab_size,
                                                          const llm::InitModelSpec& spec);

// The regular tokens of that vocabulary by id (GPT-2's byte-level strings): the 256 byte tokens, then merges
// of seed words, then every token extended by every byte, until num_regular tokens. None equals a special.
std::vector<std::string> byte_level_vocabulary(int64_t num_regular,
                                               const std::vector<llm::SpecialTokenSpec>& specials);

// tokenizer_config.json for spec (chat template, bos/eos/pad, tokenizer_class) with the given
// added_tokens_decoder ({"<id>": {"content": ..., ...}}).
nlohmann::ordered_json tokenizer_config_json(const llm::InitModelSpec& spec,
                                             nlohmann::ordered_json added_tokens_decoder);
// One added_tokens_decoder entry.
nlohmann::ordered_json added_token_entry(const llm::SpecialTokenSpec& token);

}  // namespace xmoe::app
