#include "llm/kv_cache.hpp"

#include <cstdlib>

#include "xmoe/error.hpp"

namespace xmoe::llm {

KvCache::KvCache(const KvCacheShape& shape, DType dtype, size_t budget_bytes, int block_size)
    : shape_(shape), dtype_(dtype), block_size_(block_size) {
  XMOE_CHECK(shape.num_layers > 0 && shape.num_kv_heads > 0 && shape.head_dim > 0,
             "kv cache: shape needs positive num_layers, num_kv_heads and head_dim, got ", shape.num_layers,
             ", ", shape.num_kv_heads, ", ", shape.head_dim);
  XMOE_CHECK(dtype == DType::f32 || dtype == DType::bf16, "kv cache: dtype must be float32 or bfloat16, got ",
             dtype_name(dtype));
  XMOE_CHECK(block_size > 0, "kv cache: block_size must be > 0, got ", block_size);
  const size_t per_block = bytes_per_block();
  total_blocks_ = static_cast<int64_t>(budget_bytes / per_block);
  XMOE_CHECK(total_blocks_ > 0, "kv cache: a budget of ", budget_bytes, " bytes holds no block of ",
             block_size, " tokens (", per_block, " bytes each)");
  XMOE_CHECK(total_blocks_ <= INT32_MAX, "kv cache: budget of ", budget_bytes, " bytes is too many blocks");
  storage_.reset(static_cast<std::byte*>(std::calloc(static_cast<size_t>(total_blocks_), per_block)));
  XMOE_CHECK(storage_ != nullptr, "kv cache: could not allocate ", total_blocks_ * per_block, " bytes");
  // Handed out from the back, so blocks are used in ascending order.
  free_.reserve(static_cast<size_t>(total_blocks_));
  for (int64_t b = total_blocks_ - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

size_t KvCache::bytes_per_block() const {
  // K and V of every layer.
  return 2 * static_cast<size_t>(shape_.num_layers) * static_cast<size_t>(block_size_) *
         static_cast<size_t>(shape_.num_kv_heads) * static_cast<size_t>(shape_.head_dim) * dtype_size(dtype_);
}

SequenceId KvCache::create_sequence() {
  sequences_.push_back(Sequence{true, 0, {}});
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
  const int64_t more = needed - static_cast<int64_t>(s.blocks.size());
  if (more <= 0) return true;
  if (more > static_cast<int64_t>(free_.size())) return false;
  for (int64_t i = 0; i < more; ++i) {
    s.blocks.push_back(free_.back());
    free_.pop_back();
  }
  return true;
}

void KvCache::release(SequenceId seq) {
  Sequence& s = live_sequence(sequences_, seq, "release");
  // Pushed back in reverse so the next sequence gets them in the same ascending order.
  for (auto it = s.blocks.rbegin(); it != s.blocks.rend(); ++it) free_.push_back(*it);
  s = Sequence{};
}

int64_t KvCache::length(SequenceId seq) const {
  return live_sequence(sequences_, seq, "length").length;
}

void KvCache::set_length(SequenceId seq, int64_t tokens) {
  Sequence& s = live_sequence(sequences_, seq, "set_length");
  const int64_t room = static_cast<int64_t>(s.blocks.size()) * block_size_;
  XMOE_CHECK(tokens >= 0 && tokens <= room, "kv cache: set_length: sequence ", seq, " has room for ", room,
             " tokens, got ", tokens);
  s.length = tokens;
}

const std::vector<int32_t>& KvCache::block_table(SequenceId seq) const {
  return live_sequence(sequences_, seq, "block_table").blocks;
}

namespace {
std::byte* block_part(std::byte* storage, size_t per_block, const KvCacheShape& shape, int block_size,
                      size_t elem, int64_t total, int layer, int32_t block, int which) {
  XMOE_CHECK(layer >= 0 && layer < shape.num_layers, "kv cache: layer ", layer, " out of range [0, ",
             shape.num_layers, ")");
  XMOE_CHECK(block >= 0 && block < total, "kv cache: block ", block, " out of range [0, ", total, ")");
  const size_t part = static_cast<size_t>(block_size) * static_cast<size_t>(shape.num_kv_heads) *
                      static_cast<size_t>(shape.head_dim) * elem;
  // Block-major: one block holds [layer][K, V][block_size, kv_heads, head_dim].
  return storage + static_cast<size_t>(block) * per_block + (static_cast<size_t>(layer) * 2 + which) * part;
}
}  // namespace

void* KvCache::key_block(int layer, int32_t block) {
  return block_part(storage_.get(), bytes_per_block(), shape_, block_size_, dtype_size(dtype_), total_blocks_,
                    layer, block, 0);
}

void* KvCache::value_block(int layer, int32_t block) {
  return block_part(storage_.get(), bytes_per_block(), shape_, block_size_, dtype_size(dtype_), total_blocks_,
                    layer, block, 1);
}

}  // namespace xmoe::llm
