// Paged KV cache: fixed-size blocks of tokens from one pool sized by a memory budget; each sequence holds a
// block table. Sequences join and leave between engine steps without moving other sequences' data.
//
// Layout per layer (KvCacheShape::layer_window): a full-attention layer keeps every position in the
// sequence's block table; a sliding-window layer of window w keeps only recent positions, in a ring of
// ring_blocks() blocks per sequence (position p lives in ring block (p / block_size) mod ring_blocks()).
// Blocks of the one pool serve either kind: a block holds block_size tokens of every full layer, or of every
// sliding layer (its bytes are those of the larger group).
//
// Row layout per layer (KvCacheShape::layer_latent): a layer keeps K and V of num_kv_heads × head_dim values
// per token, or (MLA) one latent vector of layer_latent[l] values per token and no V (DeepSeek-V3:
// kv_lora_rank + qk_rope_head_dim = 576 values, the normed c_kv then the roped k_pe).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "util/huge_buffer.hpp"
#include "xmoe/dtype.hpp"

namespace xmoe::llm {

struct KvCacheShape {
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  // Per layer: 0 = keep every position (full attention), w > 0 = the layer attends to its last w positions
  // and keeps only those. Empty: every layer full.
  std::vector<int64_t> layer_window = {};
  // Per layer: 0 = K and V per kv head, n > 0 = one vector of n values per token. Empty: every layer K/V.
  std::vector<int> layer_latent = {};
};

using SequenceId = int32_t;

class KvCache {
 public:
  // Allocates floor(budget_bytes / bytes_per_block) blocks of block_size tokens; throws xmoe::Error when the
  // budget holds no block.
  KvCache(const KvCacheShape& shape, DType dtype, size_t budget_bytes, int block_size = 16);

  SequenceId create_sequence();
  // Makes room for the sequence to hold `tokens` tokens in all; false (and no change) when blocks run out.
  bool reserve(SequenceId seq, int64_t tokens);
  void release(SequenceId seq);              // returns the sequence's blocks to the pool
  int64_t length(SequenceId seq) const;      // tokens stored
  void set_length(SequenceId seq, int64_t);  // after a model step wrote new tokens (≤ capacity)
  int64_t capacity(SequenceId seq) const;    // tokens the sequence has room for (what reserve made)
  // Blocks of the full-attention layers (position p in block p / block_size).
  const std::vector<int32_t>& block_table(SequenceId seq) const;
  // Blocks of the sliding-window layers, a ring (see above); empty without such layers.
  const std::vector<int32_t>& ring_table(SequenceId seq) const;

  int block_size() const { return block_size_; }
  int64_t total_blocks() const { return total_blocks_; }
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size()); }
  // Blocks a sequence of `tokens` tokens holds (full-layer blocks plus its ring).
  int64_t blocks_for(int64_t tokens) const;
  // The longest sequence the whole pool holds (INT64 max when every layer slides: a ring never grows).
  int64_t max_tokens() const;
  size_t bytes_per_block() const;
  DType dtype() const { return dtype_; }
  const KvCacheShape& shape() const { return shape_; }
  int64_t window(int layer) const;  // 0 for a full layer
  int64_t ring_blocks() const { return ring_blocks_; }
  // The most new positions one write-then-attend pass may append to a sliding layer without overwriting a
  // position that a query of the same pass still attends to (ring capacity - window + 1); unbounded (INT64
  // max) for a full layer.
  int64_t max_append(int layer) const;
  // The block (from block_table or ring_table as the layer's kind says) holding position p of `seq`, and
  // the row of p inside it.
  int32_t block_of(SequenceId seq, int layer, int64_t p) const;
  // Layer `layer`'s K (or V) rows of block `block`: [block_size, num_kv_heads, head_dim] of dtype().
  void* key_block(int layer, int32_t block);
  void* value_block(int layer, int32_t block);
  // A latent layer's rows of block `block`: [block_size, latent_width(layer)] of dtype().
  void* latent_block(int layer, int32_t block);
  int latent_width(int layer) const;  // 0 for a K/V layer
  // Bytes one token occupies in every layer together (what the cache costs per token of context, sliding
  // layers counted as if they kept every position).
  size_t bytes_per_token() const;

 private:
  struct Sequence {
    bool live = false;
    int64_t length = 0, capacity = 0;
    std::vector<int32_t> blocks, ring;
  };
  std::byte* part(int layer, int32_t block, size_t offset);
  size_t row_bytes(int layer) const;  // one token of the layer (K and V, or the latent vector)
  KvCacheShape shape_;
  DType dtype_;
  int block_size_;
  int full_layers_ = 0, window_layers_ = 0;
  std::vector<size_t>
      offset_;  // per layer: its rows' byte offset inside a block (after earlier same-kind layers)
  size_t full_row_bytes_ = 0, window_row_bytes_ = 0;  // one token of every layer of the kind
  int64_t max_window_ = 0, ring_blocks_ = 0;
  int64_t total_blocks_ = 0;
  // An anonymous mapping: a large budget costs address space, not memory, until blocks are written; in 2 MiB
  // pages, so decode's walk over a sequence's blocks (a few KiB of each layer's rows per block, the blocks a
  // whole block of every layer apart) does not miss the TLB at every block.
  ZeroedHugeBuffer storage_;
  std::vector<int32_t> free_;
  std::vector<Sequence> sequences_;
};

}  // namespace xmoe::llm
