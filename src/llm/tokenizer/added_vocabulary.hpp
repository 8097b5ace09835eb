// tokenizer.json "added_tokens": tokens matched in the text before the model runs, with HF's
// leftmost-longest matching and its single_word / lstrip / rstrip / normalized flags.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "llm/tokenizer/bpe_model.hpp"
#include "llm/tokenizer/json_fields.hpp"

namespace xmoe::tokenizer_detail {

class Normalizer;

struct AddedToken {
  std::string content;
  std::string
      surface;  // what id_to_token and decode give: HF uses the normalized content of a normalized token
  int32_t id = 0;
  bool single_word = false, lstrip = false, rstrip = false, normalized = false, special = false;
};

// Text cut at added tokens: a piece is either an added token's id or text still to be tokenized.
struct TextPiece {
  std::string text;
  std::optional<int32_t> id;
};

class AddedVocabulary {
 public:
  // Tokens whose "normalized" flag is set are matched in normalized text, so their content is normalized too.
  // Ids are assigned as HF does when it loads added_tokens: the model's id for a token in model.vocab, else
  // the next id past the model's vocabulary and the tokens added so far (the "id" field is only a record of
  // that).
  AddedVocabulary(const Json& added_tokens, const JsonPath& at, const Normalizer* normalizer,
                  const BpeModel& model);
  // Tokens with their ids already fixed (a tiktoken vocabulary's special tokens); no normalizer.
  explicit AddedVocabulary(std::vector<AddedToken> tokens);

  // HF's AddedVocabulary::extract_and_normalize: cut at tokens with normalized=false in the raw text,
  // normalize the rest, then cut at tokens with normalized=true. Pieces with no id are normalized text.
  std::vector<TextPiece> split(std::string_view text, const Normalizer* normalizer) const;

  std::optional<int32_t> token_to_id(std::string_view content) const;
  const AddedToken* by_id(int32_t id) const;
  bool is_special(int32_t id) const { return special_ids_.count(id) > 0; }
  int64_t max_id() const { return max_id_; }

 private:
  // A byte trie over token contents: finds the longest token starting at a position.
  class Trie {
   public:
    void insert(std::string_view key, size_t token_index);
    std::optional<size_t> longest_match(std::string_view text, size_t begin, size_t& end) const;
    bool empty() const { return nodes_.size() <= 1; }

   private:
    struct Node {
      std::map<unsigned char, int32_t> children;
      int64_t token = -1;
    };
    std::vector<Node> nodes_{Node{}};
  };

  void add(AddedToken token, const Normalizer* normalizer);
  void split_with(const std::string& text, const Trie& trie, std::vector<TextPiece>& out) const;

  std::vector<AddedToken> tokens_;
  TokenMap by_content_;
  std::map<int32_t, size_t> by_id_;
  std::unordered_set<int32_t> special_ids_;
  Trie raw_trie_, normalized_trie_;
  int64_t max_id_ = -1;
};

}  // namespace xmoe::tokenizer_detail
