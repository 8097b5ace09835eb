// A small byte-level BPE tokenizer in Hugging Face's format for random-weight checkpoints: every id below the
// model's vocab_size decodes to something, so a model sampling any id still produces text.
#pragma once
#include <cstdint>
#include <string>

namespace xmoe::app {

struct ByteLevelTokenizerIds {
  int32_t endoftext = -1, im_start = -1, im_end = -1;
};

// 256 byte tokens + 7 special tokens.
constexpr int64_t kMinByteLevelVocab = 263;

// Writes dir/tokenizer.json (Qwen2-style: NFC normalizer, Split with Qwen's regex + ByteLevel pre-tokenizer,
// BPE with the 256 byte tokens then merged tokens, ByteLevel decoder) and dir/tokenizer_config.json (the
// Qwen3 chat template, eos <|im_end|>, pad <|endoftext|>). The special tokens <|endoftext|>, <|im_start|>,
// <|im_end|>, <think>, </think>, <tool_call>, </tool_call> take the top 7 ids. Deterministic.
// Requires vocab_size >= kMinByteLevelVocab.
ByteLevelTokenizerIds write_byte_level_tokenizer(const std::string& dir, int64_t vocab_size);

}  // namespace xmoe::app
