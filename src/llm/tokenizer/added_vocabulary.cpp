#include "llm/tokenizer/added_vocabulary.hpp"

#include <algorithm>

#include "llm/tokenizer/normalizer.hpp"
#include "llm/tokenizer/unicode.hpp"
#include "llm/tokenizer/utf8.hpp"

namespace xmoe::tokenizer_detail {
namespace {

// The character that ends text[0, end) (text valid UTF-8, end > 0).
char32_t char_before(std::string_view text, size_t end) {
  size_t start = end - 1;
  while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
  return next_code_point(text, start);
}

bool is_word_char(char32_t c) {
  return c == U'_' || is_alphanumeric(c);
}

}  // namespace

void AddedVocabulary::Trie::insert(std::string_view key, size_t token_index) {
  int32_t node = 0;
  for (unsigned char c : key) {
    auto it = nodes_[node].children.find(c);
    if (it == nodes_[node].children.end()) {
      nodes_.push_back(Node{});
      it = nodes_[node].children.emplace(c, static_cast<int32_t>(nodes_.size() - 1)).first;
    }
    node = it->second;
  }
  if (nodes_[node].token < 0) nodes_[node].token = static_cast<int64_t>(token_index);  // first one wins
}

std::optional<size_t> AddedVocabulary::Trie::longest_match(std::string_view text, size_t begin,
                                                           size_t& end) const {
  std::optional<size_t> found;
  int32_t node = 0;
  for (size_t i = begin; i < text.size(); ++i) {
    auto it = nodes_[node].children.find(static_cast<unsigned char>(text[i]));
    if (it == nodes_[node].children.end()) break;
    node = it->second;
    if (nodes_[node].token >= 0) {
      found = static_cast<size_t>(nodes_[node].token);
      end = i + 1;
    }
  }
  return found;
}

AddedVocabulary::AddedVocabulary(const Json& added_tokens, const JsonPath& at, const Normalizer* normalizer,
                                 const BpeModel& model) {
  if (added_tokens.is_null()) return;
  XMOE_CHECK(added_tokens.is_array(), at.str(), ": expected an array");
  for (size_t i = 0; i < added_tokens.size(); ++i) {
    const Json& entry = added_tokens[i];
    const JsonPath where = at[i];
    AddedToken token;
    to_id(require(entry, "id", where), where / "id");
    token.content = require_string(entry, "content", where);
    XMOE_CHECK(!token.content.empty(), (where / "content").str(), ": empty token");
    XMOE_CHECK(valid_sequence_length(token.content, 0) > 0, (where / "content").str(), ": not valid UTF-8");
    token.single_word = bool_or(entry, "single_word", false, where);
    token.lstrip = bool_or(entry, "lstrip", false, where);
    token.rstrip = bool_or(entry, "rstrip", false, where);
    token.special = bool_or(entry, "special", false, where);
    token.normalized = bool_or(entry, "normalized", !token.special, where);
    if (auto known = token_to_id(token.content)) {
      token.id = *known;
    } else if (auto in_model = model.token_to_id(token.content)) {
      token.id = *in_model;
    } else {
      const auto model_size = static_cast<int64_t>(model.vocab_count());
      token.id = static_cast<int32_t>(max_id_ >= model_size ? max_id_ + 1 : model_size);
    }
    add(std::move(token), normalizer);
  }
}

AddedVocabulary::AddedVocabulary(std::vector<AddedToken> tokens) {
  for (AddedToken& token : tokens) add(std::move(token), nullptr);
}

void AddedVocabulary::add(AddedToken token, const Normalizer* normalizer) {
  const size_t index = tokens_.size();
  by_content_.insert_or_assign(token.content, token.id);
  by_id_.insert_or_assign(token.id, index);
  if (token.special) special_ids_.insert(token.id);
  max_id_ = std::max<int64_t>(max_id_, token.id);
  token.surface = token.normalized && normalizer ? normalizer->normalize(token.content) : token.content;
  if (token.normalized) {
    normalized_trie_.insert(token.surface, index);
  } else {
    raw_trie_.insert(token.content, index);
  }
  tokens_.push_back(std::move(token));
}

void AddedVocabulary::split_with(const std::string& text, const Trie& trie,
                                 std::vector<TextPiece>& out) const {
  // HF's find_matches over an Aho-Corasick automaton in leftmost-longest mode: after a match (even one then
  // rejected by single_word) the search resumes at its end.
  size_t start_offset = 0;
  size_t pos = 0;
  while (pos < text.size() && !trie.empty()) {
    size_t match_end = 0;
    const std::optional<size_t> found = trie.longest_match(text, pos, match_end);
    if (!found) {
      ++pos;
      continue;
    }
    const AddedToken& token = tokens_[*found];
    size_t start = pos, stop = match_end;
    pos = match_end;
    if (token.single_word) {
      const bool start_space = start == 0 || !is_word_char(char_before(text, start));
      size_t next = stop;
      const bool stop_space = stop == text.size() || !is_word_char(next_code_point(text, next));
      if (!start_space || !stop_space) continue;
    }
    if (token.lstrip) {
      size_t new_start = start;
      while (new_start > 0 && is_whitespace(char_before(text, new_start))) {
        size_t b = new_start - 1;
        while (b > 0 && (static_cast<unsigned char>(text[b]) & 0xC0) == 0x80) --b;
        new_start = b;
      }
      start = std::max(new_start, start_offset);  // spaces an earlier match already took stay with it
    }
    if (token.rstrip) {
      while (stop < text.size()) {
        size_t next = stop;
        if (!is_whitespace(next_code_point(text, next))) break;
        stop = next;
      }
    }
    if (start_offset < start) out.push_back({text.substr(start_offset, start - start_offset), std::nullopt});
    out.push_back({text.substr(start, stop - start), token.id});
    start_offset = stop;
  }
  if (start_offset < text.size()) out.push_back({text.substr(start_offset), std::nullopt});
}

std::vector<TextPiece> AddedVocabulary::split(std::string_view text, const Normalizer* normalizer) const {
  std::vector<TextPiece> raw;
  split_with(std::string(text), raw_trie_, raw);
  std::vector<TextPiece> out;
  for (TextPiece& piece : raw) {
    if (piece.id) {
      out.push_back(std::move(piece));
      continue;
    }
    std::string normalized =
        normalizer ? normalizer->normalize(std::move(piece.text)) : std::move(piece.text);
    split_with(normalized, normalized_trie_, out);
  }
  return out;
}

std::optional<int32_t> AddedVocabulary::token_to_id(std::string_view content) const {
  auto it = by_content_.find(content);
  if (it == by_content_.end()) return std::nullopt;
  return it->second;
}

const AddedToken* AddedVocabulary::by_id(int32_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

}  // namespace xmoe::tokenizer_detail
