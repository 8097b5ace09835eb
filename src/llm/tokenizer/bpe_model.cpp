#include "llm/tokenizer/bpe_model.hpp"

#include <algorithm>
#include <cstdio>
#include <queue>

#include "llm/tokenizer/utf8.hpp"

namespace xmoe::tokenizer_detail {
namespace {

// A merge "a b" as two token strings: the legacy "a b" string form or the [a, b] pair form.
template <class PathOf>
std::pair<std::string, std::string> parse_merge(const Json& entry, PathOf path_of) {
  if (entry.is_string()) {
    const std::string& text = entry.get_ref<const std::string&>();
    const size_t space = text.find(' ');
    XMOE_CHECK(space != std::string::npos && text.find(' ', space + 1) == std::string::npos, path_of().str(),
               ": expected \"<left> <right>\" with exactly one space, got \"", text, "\"");
    return {text.substr(0, space), text.substr(space + 1)};
  }
  XMOE_CHECK(entry.is_array() && entry.size() == 2 && entry[0].is_string() && entry[1].is_string(),
             path_of().str(), ": expected \"<left> <right>\" or [\"<left>\", \"<right>\"]");
  return {entry[0].get<std::string>(), entry[1].get<std::string>()};
}

std::string optional_string(const Json& object, std::string_view key, const JsonPath& at) {
  const Json* value = optional_field(object, key);
  if (!value) return {};
  XMOE_CHECK(value->is_string(), (at / key).str(), ": expected a string or null");
  return value->get<std::string>();
}

}  // namespace

void BpeModel::MergeTable::reserve(size_t count) {
  size_t capacity = 16;
  while (capacity < count * 2) capacity *= 2;
  keys_.assign(capacity, kEmpty);
  values_.assign(capacity, Merge{});
  mask_ = capacity - 1;
  size_ = 0;
}

void BpeModel::MergeTable::insert_or_assign(uint64_t key, Merge merge) {
  if ((size_ + 1) * 2 > keys_.size()) {  // keep the load factor at or below 1/2
    std::vector<uint64_t> old_keys = std::move(keys_);
    std::vector<Merge> old_values = std::move(values_);
    reserve(old_keys.size());
    for (size_t i = 0; i < old_keys.size(); ++i)
      if (old_keys[i] != kEmpty) insert_or_assign(old_keys[i], old_values[i]);
  }
  for (size_t i = hash(key) & mask_;; i = (i + 1) & mask_) {
    if (keys_[i] == kEmpty) {
      keys_[i] = key;
      values_[i] = merge;
      ++size_;
      return;
    }
    if (keys_[i] == key) {
      values_[i] = merge;
      return;
    }
  }
}

const BpeModel::Merge* BpeModel::MergeTable::find(uint64_t key) const {
  if (keys_.empty()) return nullptr;
  for (size_t i = hash(key) & mask_;; i = (i + 1) & mask_) {
    if (keys_[i] == key) return &values_[i];
    if (keys_[i] == kEmpty) return nullptr;
  }
}

BpeModel::BpeModel(const Json& model, const JsonPath& at) {
  XMOE_CHECK(model.is_object(), at.str(), ": expected an object");
  const std::string type = require_string(model, "type", at);
  XMOE_CHECK(type == "BPE", (at / "type").str(), ": unsupported model type '", type, "' (supported: BPE)");
  if (const Json* dropout = optional_field(model, "dropout")) {
    XMOE_CHECK(dropout->is_number() && dropout->get<double>() == 0.0, (at / "dropout").str(),
               ": BPE dropout makes encoding random; only null or 0 is supported");
  }

  const Json& vocab = require(model, "vocab", at);
  XMOE_CHECK(vocab.is_object(), (at / "vocab").str(), ": expected an object mapping token to id");
  vocab_.reserve(vocab.size());
  int32_t max_id = -1;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const Json& value = it.value();
    // The path is built only for an error: a vocabulary has 10^5 entries.
    const bool ok =
        value.is_number_integer() && value.get<int64_t>() >= 0 && value.get<int64_t>() <= INT32_MAX;
    const int32_t id =
        ok ? static_cast<int32_t>(value.get<int64_t>()) : to_id(value, at / "vocab" / it.key());
    vocab_.insert_or_assign(it.key(), id);
    max_id = std::max(max_id, id);
  }
  // The id table is dense. Ids may leave holes (the test fixtures keep real ids of a few thousand entries),
  // but one entry claiming a huge id must not make it allocate gigabytes (found by fuzzing): ids stay below
  // 2^20 (four times the largest vocabularies in use) or twice the entries of a bigger vocabulary.
  const int64_t max_table = std::max<int64_t>(int64_t{1} << 20, 2 * static_cast<int64_t>(vocab.size()));
  XMOE_CHECK(max_id < max_table, (at / "vocab").str(), ": id ", max_id, " is too large for a vocabulary of ",
             vocab.size(), " entries (ids must be below ", max_table, ")");
  id_to_token_.resize(static_cast<size_t>(max_id) + 1);
  has_id_.assign(id_to_token_.size(), false);
  for (const auto& [token, id] : vocab_) {
    id_to_token_[id] = token;
    has_id_[id] = true;
  }

  continuing_subword_prefix_ = optional_string(model, "continuing_subword_prefix", at);
  end_of_word_suffix_ = optional_string(model, "end_of_word_suffix", at);
  fuse_unk_ = bool_or(model, "fuse_unk", false, at);
  byte_fallback_ = bool_or(model, "byte_fallback", false, at);
  ignore_merges_ = bool_or(model, "ignore_merges", false, at);
  const std::string unk = optional_string(model, "unk_token", at);
  if (!unk.empty()) {
    auto it = vocab_.find(unk);
    XMOE_CHECK(it != vocab_.end(), (at / "unk_token").str(), ": '", unk, "' is not in model.vocab");
    unk_id_ = it->second;
  }

  small_char_id_.assign(0x400, -1);
  for (char32_t cp = 0; cp < small_char_id_.size(); ++cp) {
    std::string one;
    append_utf8(one, cp);
    if (auto it = vocab_.find(one); it != vocab_.end()) small_char_id_[cp] = it->second;
  }

  const Json& merges = require_array(model, "merges", at);
  merges_.reserve(merges.size());
  const size_t prefix_length = continuing_subword_prefix_.size();
  for (size_t i = 0; i < merges.size(); ++i) {
    auto where = [&] { return ((at / "merges")[i]).str(); };  // built only for an error
    auto [left, right] = parse_merge(merges[i], [&] { return (at / "merges")[i]; });
    auto a = vocab_.find(left), b = vocab_.find(right);
    XMOE_CHECK(a != vocab_.end(), where(), ": token '", left, "' is not in model.vocab");
    XMOE_CHECK(b != vocab_.end(), where(), ": token '", right, "' is not in model.vocab");
    const std::string merged = left + (prefix_length > 0 && right.starts_with(continuing_subword_prefix_)
                                           ? right.substr(prefix_length)
                                           : right);
    auto result = vocab_.find(merged);
    XMOE_CHECK(result != vocab_.end(), where(), ": merged token '", merged, "' is not in model.vocab");
    merges_.insert_or_assign(
        pair_key(a->second, b->second),
        Merge{static_cast<int32_t>(i), result->second});  // a later duplicate wins, as in HF
  }
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size() || !has_id_[id]) return nullptr;
  return &id_to_token_[id];
}

const BpeModel::Merge* BpeModel::find_merge(int32_t a, int32_t b) const {
  return merges_.find(pair_key(a, b));
}

void BpeModel::initial_symbols(std::string_view word, std::vector<int32_t>& symbols) const {
  std::optional<int32_t> pending_unk;  // an unk not yet written: fuse_unk may extend it
  auto emit = [&](int32_t id) {
    if (pending_unk) symbols.push_back(*pending_unk);
    pending_unk.reset();
    symbols.push_back(id);
  };
  const bool plain = continuing_subword_prefix_.empty() && end_of_word_suffix_.empty();
  std::string key;
  size_t i = 0;
  while (i < word.size()) {
    const size_t begin = i;
    const size_t n = valid_sequence_length(word, i);
    i += n > 0 ? n : 1;
    if (plain && n > 0 && n <= 2) {  // a character below U+0800: try the table first
      size_t at = begin;
      const char32_t cp = next_code_point(word, at);
      if (cp < small_char_id_.size() && small_char_id_[cp] >= 0) {
        emit(small_char_id_[cp]);
        continue;
      }
    }
    key.clear();
    if (begin > 0) key += continuing_subword_prefix_;
    key.append(word.substr(begin, i - begin));
    if (i >= word.size()) key += end_of_word_suffix_;
    if (auto it = vocab_.find(key); it != vocab_.end()) {
      emit(it->second);
      continue;
    }
    if (byte_fallback_) {
      // Every byte must exist as "<0xXX>"; otherwise the character falls through to unk.
      std::vector<int32_t> bytes;
      for (unsigned char byte : key) {
        char name[8];
        std::snprintf(name, sizeof name, "<0x%02X>", byte);
        auto it = vocab_.find(std::string_view(name));
        if (it == vocab_.end()) break;
        bytes.push_back(it->second);
      }
      if (bytes.size() == key.size()) {
        for (int32_t id : bytes) emit(id);
        continue;
      }
    }
    if (unk_id_) {
      if (pending_unk && !fuse_unk_) symbols.push_back(*pending_unk);
      pending_unk = unk_id_;
    }
    // Without an unk token HF drops a character the vocabulary cannot spell.
  }
  if (pending_unk) symbols.push_back(*pending_unk);
}

void BpeModel::merge_all(std::vector<int32_t>& ids) const {
  // HF's Word::merge_all: a min-heap of candidate merges ordered by (rank, position); entries made stale by
  // an earlier merge are skipped when popped.
  struct Symbol {
    int32_t id;
    int32_t prev, next;
    bool alive;
  };
  struct Candidate {
    int32_t rank, pos, new_id;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  const int32_t n = static_cast<int32_t>(ids.size());
  if (n < 2) return;
  std::vector<Symbol> symbols(n);
  for (int32_t i = 0; i < n; ++i) symbols[i] = {ids[i], i - 1, i + 1 < n ? i + 1 : -1, true};
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  for (int32_t i = 0; i + 1 < n; ++i)
    if (const Merge* m = find_merge(ids[i], ids[i + 1])) queue.push({m->rank, i, m->new_id});

  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    const Merge* current = find_merge(left.id, right.id);
    if (!current || current->new_id != top.new_id) continue;  // stale entry
    left.id = top.new_id;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    if (left.prev >= 0)
      if (const Merge* m = find_merge(symbols[left.prev].id, left.id))
        queue.push({m->rank, left.prev, m->new_id});
    if (left.next >= 0)
      if (const Merge* m = find_merge(left.id, symbols[left.next].id))
        queue.push({m->rank, top.pos, m->new_id});
  }
  ids.clear();
  for (int32_t i = 0; i >= 0; i = symbols[i].next) ids.push_back(symbols[i].id);
}

void BpeModel::tokenize(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (auto it = vocab_.find(word); it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  std::vector<int32_t> symbols;
  initial_symbols(word, symbols);
  merge_all(symbols);
  out.insert(out.end(), symbols.begin(), symbols.end());
}

void BpeModel::tokenize_reference(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (auto it = vocab_.find(word); it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  std::vector<int32_t> symbols;
  initial_symbols(word, symbols);
  // Repeatedly apply the lowest-ranked merge among adjacent pairs, the leftmost one on a tie.
  while (symbols.size() > 1) {
    const Merge* best = nullptr;
    size_t best_pos = 0;
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      const Merge* m = find_merge(symbols[i], symbols[i + 1]);
      if (m && (!best || m->rank < best->rank)) best = m, best_pos = i;
    }
    if (!best) break;
    symbols[best_pos] = best->new_id;
    symbols.erase(symbols.begin() + static_cast<ptrdiff_t>(best_pos) + 1);
  }
  out.insert(out.end(), symbols.begin(), symbols.end());
}

}  // namespace xmoe::tokenizer_detail
