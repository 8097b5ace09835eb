#include "llm/tokenizer/tiktoken_vocabulary.hpp"

#include <algorithm>
#include <functional>
#include <limits>
#include <queue>
#include <tuple>
#include <unordered_map>

#include "xmoe/error.hpp"

namespace xmoe::tokenizer_detail {
namespace {

// The longest line accepted: real vocabularies have tokens of at most a few hundred bytes, and a bound keeps
// a hostile file from holding megabyte tokens that every encode would hash.
constexpr size_t kMaxLineBytes = 4096;
// Ranks leave room below INT32_MAX for the special tokens numbered after them.
constexpr int64_t kMaxRank = (int64_t{1} << 30) - 1;

int base64_value(unsigned char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

std::string printable(std::string_view s) {
  std::string out;
  for (unsigned char c : s.substr(0, 64)) {
    if (c >= 0x20 && c < 0x7F) {
      out += static_cast<char>(c);
    } else {
      static constexpr char kHex[] = "0123456789ABCDEF";
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  if (s.size() > 64) out += "...";
  return out;
}

// Standard base64 with padding (what tiktoken's writer produces); anything else is an error naming the spot.
std::string decode_base64(std::string_view text, const std::string& at) {
  XMOE_CHECK(!text.empty() && text.size() % 4 == 0, at, ": bad base64 '", printable(text), "': length ",
             text.size(), " is not a positive multiple of 4");
  size_t padding = 0;
  while (padding < 2 && text[text.size() - 1 - padding] == '=') ++padding;
  std::string out;
  out.reserve(text.size() / 4 * 3);
  uint32_t bits = 0;
  int count = 0;
  for (size_t i = 0; i + padding < text.size(); ++i) {
    const int v = base64_value(static_cast<unsigned char>(text[i]));
    XMOE_CHECK(v >= 0, at, ": bad base64 '", printable(text), "': character '", printable(text.substr(i, 1)),
               "' at column ", i + 1);
    bits = (bits << 6) | static_cast<uint32_t>(v);
    if (++count == 4) {
      out += static_cast<char>((bits >> 16) & 0xFF);
      out += static_cast<char>((bits >> 8) & 0xFF);
      out += static_cast<char>(bits & 0xFF);
      bits = 0;
      count = 0;
    }
  }
  if (count == 3) {  // one '=': 18 bits hold two bytes
    out += static_cast<char>((bits >> 10) & 0xFF);
    out += static_cast<char>((bits >> 2) & 0xFF);
  } else if (count == 2) {  // two '=': 12 bits hold one byte
    out += static_cast<char>((bits >> 4) & 0xFF);
  }
  XMOE_CHECK(!out.empty(), at, ": bad base64 '", printable(text), "': an empty token");
  return out;
}

int64_t parse_rank(std::string_view text, const std::string& at) {
  XMOE_CHECK(!text.empty() && text.size() <= 10 &&
                 std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; }),
             at, ": rank '", printable(text), "' is not a non-negative integer below 2^30");
  int64_t rank = 0;
  for (char c : text) rank = rank * 10 + (c - '0');
  XMOE_CHECK(rank <= kMaxRank, at, ": rank ", rank, " is too large (at most ", kMaxRank, ")");
  return rank;
}

bool is_field_space(char c) {
  return c == ' ' || c == '\t' || c == '\v' || c == '\f';
}

bool can_occur_in_utf8(int byte) {
  return byte != 0xC0 && byte != 0xC1 && byte < 0xF5;
}

}  // namespace

TiktokenVocabulary::TiktokenVocabulary(std::string_view text, const std::string& where) {
  std::unordered_map<int64_t, size_t> line_of_rank;
  std::vector<std::pair<int64_t, std::string>> entries;
  size_t line_number = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    // Lines end at "\n", "\r\n" or a lone "\r", as Python's bytes.splitlines (tiktoken's reader) splits them.
    size_t end = pos;
    while (end < text.size() && text[end] != '\n' && text[end] != '\r') ++end;
    const std::string_view line = text.substr(pos, end - pos);
    pos = end;
    if (pos < text.size())
      pos += (text[pos] == '\r' && pos + 1 < text.size() && text[pos + 1] == '\n') ? 2 : 1;
    ++line_number;
    if (line.empty()) continue;
    const std::string at = where + ":" + std::to_string(line_number);
    XMOE_CHECK(line.size() <= kMaxLineBytes, at, ": line is ", line.size(), " bytes long (at most ",
               kMaxLineBytes, ")");
    std::vector<std::string_view> fields;
    for (size_t i = 0; i < line.size();) {
      while (i < line.size() && is_field_space(line[i])) ++i;
      size_t j = i;
      while (j < line.size() && !is_field_space(line[j])) ++j;
      if (j > i) fields.push_back(line.substr(i, j - i));
      i = j;
    }
    XMOE_CHECK(fields.size() == 2, at, ": expected '<base64 token> <rank>', got '", printable(line), "'");
    std::string token = decode_base64(fields[0], at);
    const int64_t rank = parse_rank(fields[1], at);
    const auto [rank_it, new_rank] = line_of_rank.emplace(rank, line_number);
    XMOE_CHECK(new_rank, at, ": duplicate rank ", rank, " (also on line ", rank_it->second, ")");
    entries.emplace_back(rank, std::move(token));
  }
  XMOE_CHECK(!entries.empty(), where, ": no tokens");
  const auto count = static_cast<int64_t>(entries.size());
  // N distinct ranks are 0..N-1 exactly when none is >= N: special tokens are numbered from N on.
  for (int64_t rank = 0; rank < count; ++rank) {
    XMOE_CHECK(line_of_rank.count(rank), where, ": ranks are not 0..", count - 1, " (", count,
               " tokens): rank ", rank, " is missing");
  }
  by_rank_.resize(entries.size());
  by_bytes_.reserve(entries.size());
  for (auto& [rank, token] : entries) {
    const auto [it, inserted] = by_bytes_.emplace(token, static_cast<int32_t>(rank));
    XMOE_CHECK(inserted, where, ":", line_of_rank[rank], ": duplicate token '", printable(token),
               "' (also rank ", it->second, " on line ", line_of_rank[it->second], ")");
    by_rank_[static_cast<size_t>(rank)] = std::move(token);
  }
  // tiktoken's merge loop ends on single bytes when nothing merges: each byte valid UTF-8 text can hold
  // needs a token (tiktoken itself would panic on such text).
  for (int byte = 0; byte < 256; ++byte) {
    if (!can_occur_in_utf8(byte)) continue;
    XMOE_CHECK(by_bytes_.count(std::string(1, static_cast<char>(byte))), where, ": no token for the byte 0x",
               printable(std::string(1, static_cast<char>(byte))), " (", byte,
               "): every byte of valid UTF-8 needs a single-byte token");
  }
}

std::optional<int32_t> TiktokenVocabulary::rank_of(std::string_view bytes) const {
  auto it = by_bytes_.find(bytes);
  if (it == by_bytes_.end()) return std::nullopt;
  return it->second;
}

int32_t TiktokenVocabulary::require_rank(std::string_view bytes) const {
  const auto rank = rank_of(bytes);
  XMOE_CHECK(rank.has_value(), "tiktoken: no token for the bytes '", printable(bytes), "'");
  return *rank;
}

void TiktokenVocabulary::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (auto whole = rank_of(piece)) {
    out.push_back(*whole);
    return;
  }
  // Parts are byte ranges [start, next[start]); a heap holds candidate merges (rank, left start, right end).
  // An entry is stale once either part has changed: its left part is gone, or the two parts no longer end at
  // right end. Popping the least (rank, left start) is tiktoken's choice: the lowest rank, leftmost on ties.
  const size_t n = piece.size();
  std::vector<size_t> next(n), prev(n);
  std::vector<bool> alive(n, true);
  for (size_t i = 0; i < n; ++i) {
    next[i] = i + 1;
    prev[i] = i - 1;  // wraps for i = 0: never read, since a part at 0 has no left neighbour
  }
  using Candidate = std::tuple<int32_t, size_t, size_t>;
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto push_pair = [&](size_t left) {
    const size_t mid = next[left];
    if (mid >= n) return;
    const size_t end = next[mid];
    if (auto rank = rank_of(piece.substr(left, end - left))) heap.emplace(*rank, left, end);
  };
  for (size_t i = 0; i + 1 < n; ++i) push_pair(i);
  while (!heap.empty()) {
    const auto [rank, left, end] = heap.top();
    heap.pop();
    if (!alive[left] || next[left] >= n || next[next[left]] != end) continue;
    const size_t right = next[left];
    alive[right] = false;
    next[left] = end;
    if (end < n) prev[end] = left;
    if (left > 0) push_pair(prev[left]);
    push_pair(left);
  }
  for (size_t i = 0; i < n; i = next[i]) out.push_back(require_rank(piece.substr(i, next[i] - i)));
}

void TiktokenVocabulary::encode_piece_reference(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (auto whole = rank_of(piece)) {
    out.push_back(*whole);
    return;
  }
  std::vector<size_t> starts;  // part i is [starts[i], starts[i + 1])
  for (size_t i = 0; i <= piece.size(); ++i) starts.push_back(i);
  while (true) {
    int32_t best = std::numeric_limits<int32_t>::max();
    size_t best_i = 0;
    for (size_t i = 0; i + 2 < starts.size(); ++i) {
      const auto rank = rank_of(piece.substr(starts[i], starts[i + 2] - starts[i]));
      if (rank && *rank < best) {
        best = *rank;
        best_i = i;
      }
    }
    if (best == std::numeric_limits<int32_t>::max()) break;
    starts.erase(starts.begin() + static_cast<std::ptrdiff_t>(best_i) + 1);
  }
  for (size_t i = 0; i + 1 < starts.size(); ++i)
    out.push_back(require_rank(piece.substr(starts[i], starts[i + 1] - starts[i])));
}

}  // namespace xmoe::tokenizer_detail
