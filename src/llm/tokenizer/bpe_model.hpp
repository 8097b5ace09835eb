// tokenizer.json "model" of type BPE: vocab, merges (ranked, "a b" or ["a", "b"]), ignore_merges,
// unk_token/fuse_unk, byte_fallback, continuing_subword_prefix and end_of_word_suffix.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "llm/tokenizer/json_fields.hpp"

namespace xmoe::tokenizer_detail {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using TokenMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

class BpeModel {
 public:
  BpeModel(const Json& model, const JsonPath& at);

  // Appends the ids of one pre-token (already byte-level mapped when the tokenizer is byte-level).
  void tokenize(std::string_view word, std::vector<int32_t>& out) const;
  // The plain merge loop HF's Word::merge_all runs, kept as the reference for tokenize's fast paths.
  void tokenize_reference(std::string_view word, std::vector<int32_t>& out) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  const std::string* id_to_token(int32_t id) const;     // nullptr when absent
  size_t vocab_count() const { return vocab_.size(); }  // HF's get_vocab_size (not max id + 1)
  int64_t max_id() const { return static_cast<int64_t>(id_to_token_.size()) - 1; }

 private:
  struct Merge {
    int32_t rank;
    int32_t new_id;
  };
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  const Merge* find_merge(int32_t a, int32_t b) const;
  // The initial symbols of a word (characters, with byte fallback / unk handling), before any merge.
  void initial_symbols(std::string_view word, std::vector<int32_t>& symbols) const;
  void merge_all(std::vector<int32_t>& symbols) const;

  // Open addressing over (left id, right id) keys: the merge lookup is the inner loop of BPE.
  class MergeTable {
   public:
    void reserve(size_t count);
    void insert_or_assign(uint64_t key, Merge merge);
    const Merge* find(uint64_t key) const;

   private:
    static size_t hash(uint64_t key) { return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> 17); }
    static constexpr uint64_t kEmpty = ~0ull;  // ids are < 2^31, so no real key has all bits set
    std::vector<uint64_t> keys_;
    std::vector<Merge> values_;
    size_t mask_ = 0, size_ = 0;
  };

  TokenMap vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> has_id_;
  std::vector<int32_t> small_char_id_;  // id of each one-character token below U+0400 (-1 = none): byte-level
                                        // words are made of these, so most look-ups skip hashing a string
  MergeTable merges_;
  std::optional<int32_t> unk_id_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;
};

}  // namespace xmoe::tokenizer_detail
