// The paged KV cache: budget → block count, reserve / release / out-of-blocks, block tables, and where a
// block's K and V rows live.
#include <gtest/gtest.h>

#include <cstring>
#include <set>

#include "llm/kv_cache.hpp"
#include "xmoe/error.hpp"

namespace xmoe::llm {
namespace {

const KvCacheShape kShape{3, 2, 8};  // 3 layers, 2 kv heads of 8

TEST(KvCache, BudgetGivesWholeBlocks) {
  // K and V × 3 layers × 4 tokens × 2 heads × 8 dims × 4 bytes.
  const size_t per_block = 2 * 3 * 4 * 2 * 8 * 4;
  KvCache cache(kShape, DType::f32, 10 * per_block + per_block - 1, 4);
  EXPECT_EQ(cache.bytes_per_block(), per_block);
  EXPECT_EQ(cache.total_blocks(), 10);
  EXPECT_EQ(cache.free_blocks(), 10);
  KvCache half(kShape, DType::bf16, 10 * per_block, 4);
  EXPECT_EQ(half.bytes_per_block(), per_block / 2);
  EXPECT_EQ(half.total_blocks(), 20);
}

TEST(KvCache, BudgetBelowOneBlockThrows) {
  EXPECT_THROW(KvCache(kShape, DType::f32, 2 * 3 * 4 * 2 * 8 * 4 - 1, 4), Error);
  EXPECT_THROW(KvCache(kShape, DType::f32, 1 << 20, 0), Error);
  EXPECT_THROW(KvCache(kShape, DType::f64, 1 << 20, 4), Error);
  EXPECT_THROW(KvCache(KvCacheShape{0, 2, 8}, DType::f32, 1 << 20, 4), Error);
}

TEST(KvCache, ReserveTakesBlocksAndFailsWithoutChangeWhenTheyRunOut) {
  KvCache cache(kShape, DType::f32, 5 * 2 * 3 * 4 * 2 * 8 * 4, 4);  // 5 blocks of 4 tokens
  const SequenceId a = cache.create_sequence(), b = cache.create_sequence();
  EXPECT_TRUE(cache.reserve(a, 5));  // 2 blocks
  EXPECT_EQ(cache.block_table(a).size(), 2u);
  EXPECT_EQ(cache.free_blocks(), 3);
  EXPECT_TRUE(cache.reserve(a, 8));  // still 2
  EXPECT_EQ(cache.free_blocks(), 3);
  EXPECT_TRUE(cache.reserve(a, 3));  // never shrinks
  EXPECT_EQ(cache.block_table(a).size(), 2u);
  EXPECT_FALSE(cache.reserve(b, 13));  // 4 blocks > 3 free
  EXPECT_EQ(cache.free_blocks(), 3);
  EXPECT_TRUE(cache.block_table(b).empty());
  EXPECT_TRUE(cache.reserve(b, 12));
  EXPECT_EQ(cache.free_blocks(), 0);
  EXPECT_FALSE(cache.reserve(a, 9));
  EXPECT_EQ(cache.block_table(a).size(), 2u);
  // Distinct blocks.
  std::set<int32_t> all(cache.block_table(a).begin(), cache.block_table(a).end());
  all.insert(cache.block_table(b).begin(), cache.block_table(b).end());
  EXPECT_EQ(all.size(), 5u);

  cache.release(a);
  EXPECT_EQ(cache.free_blocks(), 2);
  EXPECT_THROW(cache.length(a), Error);  // released
  const SequenceId c = cache.create_sequence();
  EXPECT_TRUE(cache.reserve(c, 8));
  EXPECT_EQ(cache.free_blocks(), 0);
  cache.release(b);
  cache.release(c);
  EXPECT_EQ(cache.free_blocks(), cache.total_blocks());
}

TEST(KvCache, LengthsAndErrors) {
  KvCache cache(kShape, DType::bf16, 1 << 16, 4);
  const SequenceId s = cache.create_sequence();
  EXPECT_EQ(cache.length(s), 0);
  EXPECT_THROW(cache.set_length(s, 1), Error);  // nothing reserved
  ASSERT_TRUE(cache.reserve(s, 6));
  cache.set_length(s, 8);  // two whole blocks reserved
  EXPECT_EQ(cache.length(s), 8);
  EXPECT_THROW(cache.set_length(s, 9), Error);
  EXPECT_THROW(cache.set_length(s, -1), Error);
  EXPECT_THROW(cache.reserve(s, -1), Error);
  EXPECT_THROW(cache.reserve(99, 1), Error);
  EXPECT_THROW(cache.release(99), Error);
  EXPECT_THROW(cache.block_table(-1), Error);
  cache.release(s);
  EXPECT_THROW(cache.release(s), Error);
}

TEST(KvCache, BlocksHoldSeparateKeyAndValueRowsPerLayer) {
  KvCache cache(kShape, DType::f32, 4 * 2 * 3 * 4 * 2 * 8 * 4, 4);
  const size_t part = 4 * 2 * 8 * sizeof(float);
  std::set<const void*> seen;
  for (int32_t b = 0; b < cache.total_blocks(); ++b)
    for (int l = 0; l < kShape.num_layers; ++l) {
      auto* k = static_cast<std::byte*>(cache.key_block(l, b));
      auto* v = static_cast<std::byte*>(cache.value_block(l, b));
      EXPECT_TRUE(seen.insert(k).second);
      EXPECT_TRUE(seen.insert(v).second);
      EXPECT_GE(static_cast<size_t>(std::abs(v - k)), part);
      std::memset(k, 0x11, part);  // writable over the whole part
      std::memset(v, 0x22, part);
    }
  // Every part is disjoint: the writes above did not overwrite each other.
  for (int32_t b = 0; b < cache.total_blocks(); ++b)
    for (int l = 0; l < kShape.num_layers; ++l) {
      const auto* k = static_cast<const unsigned char*>(cache.key_block(l, b));
      const auto* v = static_cast<const unsigned char*>(cache.value_block(l, b));
      EXPECT_EQ(k[0], 0x11);
      EXPECT_EQ(k[part - 1], 0x11);
      EXPECT_EQ(v[0], 0x22);
      EXPECT_EQ(v[part - 1], 0x22);
    }
  EXPECT_THROW(cache.key_block(3, 0), Error);
  EXPECT_THROW(cache.value_block(0, 4), Error);
}

}  // namespace
}  // namespace xmoe::llm
