// The vocabulary of app/byte_level_tokenizer_writer.hpp in tiktoken's format, as Kimi-K2 ships it, for
// architectures whose InitModelSpec asks for it (tiktoken_vocabulary): tiktoken.model (base64 token and rank
// per line) and tokenizer_config.json whose added_tokens_decoder names the special tokens in the 256 ids
// reserved after the vocabulary (tokenization_kimi.py's layout; its pre-tokenizer pattern applies).
#pragma once
#include <cstdint>
#include <map>
#include <string>

#include "llm/arch/architecture.hpp"

namespace xmoe::app {

// 256 byte tokens + the 256 reserved special ids.
inline constexpr int64_t kMinTiktokenVocab = 512;

// Writes dir/tiktoken.model (ranks 0..vocab_size-257) and dir/tokenizer_config.json; the spec's special
// tokens take the first reserved ids in spec order. Deterministic. Returns each special token's id by
// content. Requires vocab_size >= kMinTiktokenVocab and at most 256 special tokens.
std::map<std::string, int32_t> write_tiktoken_tokenizer(const std::string& dir, int64_t vocab_size,
                                                        const llm::InitModelSpec& spec);

}  // namespace xmoe::app
