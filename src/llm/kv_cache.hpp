// Paged KV cache: fixed-size blocks of tokens from one pool sized by a memory budget; each sequence holds a
// block table. Sequences join and leave between engine steps without moving other sequences' data.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

#include "xmoe/dtype.hpp"

namespace xmoe::llm {

struct KvCacheShape {
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
};

using SequenceId = int32_t;

class KvCache {
 public:
  // Allocates floor(budget_bytes / bytes_per_block) blocks of block_size tokens (K and V of every layer);
  // throws xmoe::Error when the budget holds no block.
  KvCache(const KvCacheShape& shape, DType dtype, size_t budget_bytes, int block_size = 16);

  SequenceId create_sequence();
  // Makes room for the sequence to hold `tokens` tokens in all; false (and no change) when blocks run out.
  bool reserve(SequenceId seq, int64_t tokens);
  void release(SequenceId seq);              // returns the sequence's blocks to the pool
  int64_t length(SequenceId seq) const;      // tokens stored
  void set_length(SequenceId seq, int64_t);  // after a model step wrote new tokens (≤ reserved)
  const std::vector<int32_t>& block_table(SequenceId seq) const;

  int block_size() const { return block_size_; }
  int64_t total_blocks() const { return total_blocks_; }
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size()); }
  size_t bytes_per_block() const;
  DType dtype() const { return dtype_; }
  const KvCacheShape& shape() const { return shape_; }
  // Layer `layer`'s K (or V) rows of block `block`: [block_size, num_kv_heads, head_dim] of dtype().
  void* key_block(int layer, int32_t block);
  void* value_block(int layer, int32_t block);

 private:
  struct Sequence {
    bool live = false;
    int64_t length = 0;
    std::vector<int32_t> blocks;
  };
  KvCacheShape shape_;
  DType dtype_;
  int block_size_;
  int64_t total_blocks_ = 0;
  // calloc'd: a large budget costs address space, not memory, until blocks are written.
  std::unique_ptr<std::byte, decltype(&std::free)> storage_{nullptr, &std::free};
  std::vector<int32_t> free_;
  std::vector<Sequence> sequences_;
};

}  // namespace xmoe::llm
