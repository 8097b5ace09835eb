#include "llm/kv_cache.hpp"

#include <algorithm>
#include <limits>
#include <new>

#include "xmoe/error.hpp"

namespace xmoe::llm {

KvCache::KvCache(const KvCacheShape& shape, DType dtype, size_t budget_bytes, int block_size)
    : shape_(shape), dtype_(dtype), block_size_(block_size) {
  XMOE_CHECK(shape.num_layers > 0 && shape.num_kv_heads > 0 && shape.head_dim > 0,
             "kv cache: shape needs positive num_layers, num_kv_heads and head_dim, got ", shape.num_layers,
             ", ", shape.num_kv_heads, ", ", shape.head_dim);
  XMOE_CHECK(shape.layer_window.empty() || shape.layer_window.size() == static_cast<size_t>(shape.num_layers),
             "kv cache: layer_window has ", shape.layer_window.size(), " entries for ", shape.num_layers,
             " layers");
  XMOE_CHECK(shape.layer_latent.empty() || shape.layer_latent.size() == static_cast<size_t>(shape.num_layers),
             "kv cache: layer_latent has ", shape.layer_latent.size(), " entries for ", shape.num_layers,
             " layers");
  XMOE_CHECK(dtype == DType::f32 || dtype == DType::bf16, "kv cache: dtype must be float32 or bfloat16, got ",
             dtype_name(dtype));
  XMOE_CHECK(block_size > 0, "kv cache: block_size must be > 0, got ", block_size);
  for (int l = 0; l < shape.num_layers; ++l) {
    const int64_t w = window(l);
    XMOE_CHECK(w >= 0, "kv cache: layer ", l, " has window ", w, " (must be >= 0)");
    XMOE_CHECK(latent_width(l) >= 0, "kv cache: layer ", l, " has latent width ", latent_width(l),
               " (must be >= 0)");
    (w > 0 ? window_layers_ : full_layers_)++;
    size_t& group = w > 0 ? window_row_bytes_ : full_row_bytes_;
    offset_.push_back(group * static_cast<size_t>(block_size));
    group += row_bytes(l);
    max_window_ = std::max(max_window_, w);
  }
  // The ring holds a window plus at least one block of new positions: window - 1 earlier positions and the
  // block being appended (see max_append).
  if (window_layers_ > 0) ring_blocks_ = (max_window_ - 1 + block_size - 1) / block_size + 1;
  const size_t per_block = bytes_per_block();
  total_blocks_ = static_cast<int64_t>(budget_bytes / per_block);
  XMOE_CHECK(total_blocks_ > 0, "kv cache: a budget of ", budget_bytes, " bytes holds no block of ",
             block_size, " tokens (", per_block, " bytes each)");
  XMOE_CHECK(total_blocks_ <= INT32_MAX, "kv cache: budget of ", budget_bytes, " bytes is too many blocks");
  try {
    storage_ = allocate_zeroed_huge_buffer(static_cast<size_t>(total_blocks_) * per_block);
  } catch (const std::bad_alloc&) {
    throw Error(detail::concat("kv cache: could not allocate ", total_blocks_ * per_block, " bytes"));
  }
  // Handed out from the back, so blocks are used in ascending order.
  free_.reserve(static_cast<size_t>(total_blocks_));
  for (int64_t b = total_blocks_ - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

int64_t KvCache::window(int layer) const {
  return shape_.layer_window.empty() ? 0 : shape_.layer_window[static_cast<size_t>(layer)];
}

int KvCache::latent_width(int layer) const {
  return shape_.layer_latent.empty() ? 0 : shape_.layer_latent[static_cast<size_t>(layer)];
}

size_t KvCache::row_bytes(int layer) const {
  const int latent = latent_width(layer);
  const size_t values =
      latent > 0 ? static_cast<size_t>(latent)
                 : 2 * static_cast<size_t>(shape_.num_kv_heads) * static_cast<size_t>(shape_.head_dim);
  return values * dtype_size(dtype_);
}

size_t KvCache::bytes_per_block() const {
  // Every layer of the larger group (in bytes).
  return std::max(full_row_bytes_, window_row_bytes_) * static_cast<size_t>(block_size_);
}

size_t KvCache::bytes_per_token() const {
  return full_row_bytes_ + window_row_bytes_;
}

int64_t KvCache::blocks_for(int64_t tokens) const {
  const int64_t blocks = (tokens + block_size_ - 1) / block_size_;
  return (full_layers_ > 0 ? blocks : 0) + std::min(blocks, ring_blocks_);
}

int64_t KvCache::max_tokens() const {
  if (full_layers_ == 0) return std::numeric_limits<int64_t>::max();
  // b full blocks need b + min(b, ring_blocks) in all.
  const int64_t b = total_blocks_ >= 2 * ring_blocks_ ? total_blocks_ - ring_blocks_ : total_blocks_ / 2;
  return (window_layers_ > 0 ? b : total_blocks_) * block_size_;
}

int64_t KvCache::max_append(int layer) const {
  const int64_t w = window(layer);
  if (w == 0) return std::numeric_limits<int64_t>::max();
  return ring_blocks_ * block_size_ - w + 1;
}

SequenceId KvCache::create_sequence() {
  sequences_.push_back(Sequence{true, 0, 0, {}, {}});
  return static_cast<SequenceId>(sequences_.size() - 1);
}

namespace {
template <class Seqs>
auto& live_sequence(Seqs& sequences, SequenceId seq, const char* where) {
  XMOE_CHECK(
      seq >= 0 && static_cast<size_t>(seq) < sequences.size() && sequences[static_cast<size_t>(seq)].live,
      "kv cache: ", where, ": sequence ", seq, " does not exist or was released");
  return sequences[static_cast<size_t>(seq)];
}
}  // namespace

bool KvCache::reserve(SequenceId seq, int64_t tokens) {
  Sequence& s = live_sequence(sequences_, seq, "reserve");
  XMOE_CHECK(tokens >= 0, "kv cache: reserve: tokens must be >= 0, got ", tokens);
  const int64_t needed = (tokens + block_size_ - 1) / block_size_;
  const int64_t more_full = full_layers_ > 0 ? needed - static_cast<int64_t>(s.blocks.size()) : 0;
  const int64_t more_ring = std::min(needed, ring_blocks_) - static_cast<int64_t>(s.ring.size());
  const int64_t more = std::max<int64_t>(more_full, 0) + std::max<int64_t>(more_ring, 0);
  if (more > static_cast<int64_t>(free_.size())) return false;
  for (int64_t i = 0; i < more_full; ++i) {
    s.blocks.push_back(free_.back());
    free_.pop_back();
  }
  for (int64_t i = 0; i < more_ring; ++i) {
    s.ring.push_back(free_.back());
    free_.pop_back();
  }
  s.capacity = std::max(s.capacity, needed * block_size_);
  return true;
}

void KvCache::release(SequenceId seq) {
  Sequence& s = live_sequence(sequences_, seq, "release");
  // Pushed back in reverse so the next sequence gets them in the same ascending order.
  for (auto it = s.ring.rbegin(); it != s.ring.rend(); ++it) free_.push_back(*it);
  for (auto it = s.blocks.rbegin(); it != s.blocks.rend(); ++it) free_.push_back(*it);
  s = Sequence{};
}

int64_t KvCache::length(SequenceId seq) const {
  return live_sequence(sequences_, seq, "length").length;
}

int64_t KvCache::capacity(SequenceId seq) const {
  return live_sequence(sequences_, seq, "capacity").capacity;
}

void KvCache::set_length(SequenceId seq, int64_t tokens) {
  Sequence& s = live_sequence(sequences_, seq, "set_length");
  XMOE_CHECK(tokens >= 0 && tokens <= s.capacity, "kv cache: set_length: sequence ", seq, " has room for ",
             s.capacity, " tokens, got ", tokens);
  s.length = tokens;
}

const std::vector<int32_t>& KvCache::block_table(SequenceId seq) const {
  return live_sequence(sequences_, seq, "block_table").blocks;
}

const std::vector<int32_t>& KvCache::ring_table(SequenceId seq) const {
  return live_sequence(sequences_, seq, "ring_table").ring;
}

int32_t KvCache::block_of(SequenceId seq, int layer, int64_t p) const {
  const Sequence& s = live_sequence(sequences_, seq, "block_of");
  XMOE_CHECK(p >= 0 && p < s.capacity, "kv cache: sequence ", seq, " has room for ", s.capacity,
             " tokens, position ", p, " is outside (reserve first)");
  if (window(layer) == 0) return s.blocks[static_cast<size_t>(p / block_size_)];
  return s.ring[static_cast<size_t>((p / block_size_) % ring_blocks_)];
}

std::byte* KvCache::part(int layer, int32_t block, size_t offset) {
  XMOE_CHECK(layer >= 0 && layer < shape_.num_layers, "kv cache: layer ", layer, " out of range [0, ",
             shape_.num_layers, ")");
  XMOE_CHECK(block >= 0 && block < total_blocks_, "kv cache: block ", block, " out of range [0, ",
             total_blocks_, ")");
  // Block-major: one block holds, per layer of its kind, [K, V][block_size, kv_heads, head_dim] or
  // [block_size, latent_width].
  return storage_.get() + static_cast<size_t>(block) * bytes_per_block() +
         offset_[static_cast<size_t>(layer)] + offset;
}

void* KvCache::key_block(int layer, int32_t block) {
  XMOE_CHECK(layer < 0 || layer >= shape_.num_layers || latent_width(layer) == 0, "kv cache: layer ", layer,
             " keeps a latent vector, not K and V");
  return part(layer, block, 0);
}

void* KvCache::value_block(int layer, int32_t block) {
  XMOE_CHECK(layer < 0 || layer >= shape_.num_layers || latent_width(layer) == 0, "kv cache: layer ", layer,
             " keeps a latent vector, not K and V");
  return part(layer, block, row_bytes(layer) / 2 * static_cast<size_t>(block_size_));
}

void* KvCache::latent_block(int layer, int32_t block) {
  XMOE_CHECK(layer >= 0 && layer < shape_.num_layers && latent_width(layer) > 0, "kv cache: layer ", layer,
             " keeps no latent vector");
  return part(layer, block, 0);
}

}  // namespace xmoe::llm
