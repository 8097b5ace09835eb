// Causal attention over a paged K/V cache, flash-attention style on the CPU: a tile of query rows (all the
// query heads that share one K/V head, so each K/V block is read once for the group) walks the K/V positions
// in chunks of kAttentionChunk, with an online softmax (running max and sum) and f32 accumulation. One call
// serves prefill (many rows per sequence) and batched decode (one row for each of many sequences).
//
// Semantics are transformers' eager attention: out = softmax(q·Kᵀ·scale)·V over the positions
// [max(0, p − window + 1), p] of a query at position p (window 0: [0, p]); with sinks, a learned logit per
// query head joins the softmax denominator only (gpt-oss).
//
// General enough for MLA's absorbed decode: kv_heads = 1 with every query head on it, K width ≠ V width
// (V may be the first v_dim values of the K rows: pass the same blocks and strides), an explicit scale.
//
// Determinism: every (row, head) result is computed by the same operations in the same order whatever the
// tile it falls in, the tiles' shapes, the other sequences of the call and the thread count, so results are
// bit-identical across thread counts and batch compositions.
#pragma once
#include <cstddef>
#include <cstdint>

#include "xmoe/dtype.hpp"

namespace xmoe::kernels {

struct KernelTable;

// Positions per online-softmax step (aligned to multiples of it inside each cache block).
inline constexpr int kAttentionChunk = 16;

// One sequence of a call: n_q query rows at the consecutive positions pos0, pos0 + 1, ...
struct AttentionSequence {
  const float* q = nullptr;  // row r, query head h: q[r·q_ld + h·q_head_stride + (0..k_dim)]
  float* out = nullptr;      // row r, query head h: out[r·out_ld + h·out_head_stride + (0..v_dim)]
  int64_t n_q = 0, pos0 = 0;
  // The cache block holding positions [j·block_size, (j + 1)·block_size) is k_blocks[j − first_block] (and
  // v_blocks likewise); the entries must cover every block a query attends to (a sliding layer's ring is
  // resolved by the caller into this logical order).
  const void* const* k_blocks = nullptr;
  const void* const* v_blocks = nullptr;
  int64_t first_block = 0;
};

struct AttentionArgs {
  int heads = 0, kv_heads = 0;   // query head h reads K/V head h / (heads / kv_heads)
  int k_dim = 0, v_dim = 0;      // widths of q·k and of v (and out)
  float scale = 1.0f;            // logits are (q·k)·scale
  int64_t window = 0;            // 0: causal over every earlier position; w: the last w positions
  const float* sinks = nullptr;  // [heads] sink logits, or none
  int64_t q_ld = 0, q_head_stride = 0, out_ld = 0, out_head_stride = 0;
  // The cache: a block is block_size positions; inside it K of position i, head g starts at
  // i·k_pos_stride + g·k_head_stride elements of kv_dtype (f32 or bf16), V likewise.
  DType kv_dtype = DType::f32;
  int block_size = 0;
  int64_t k_pos_stride = 0, k_head_stride = 0, v_pos_stride = 0, v_head_stride = 0;
  const AttentionSequence* seqs = nullptr;
  int64_t num_seqs = 0;
};

// A work item: query rows [row0, row0 + rows) of sequence seq, query heads [head0, head0 + head_count) (all
// on one K/V head).
struct AttentionItem {
  int64_t seq = 0, row0 = 0, rows = 0;
  int head0 = 0, head_count = 0;
};

// A table entry: one work item, single-threaded, with `scratch` of attention_scratch_floats(args,
// item.rows · item.head_count) floats (64-byte aligned).
using AttentionTileFn = void (*)(const AttentionArgs& args, const AttentionItem& item, float* scratch);

// Floats of scratch a work item of `query_rows` (rows × heads) needs.
size_t attention_scratch_floats(const AttentionArgs& args, int64_t query_rows);

// Throws xmoe::Error naming what is wrong with args (heads, widths, strides, dtype, sequences).
void check_attention_args(const AttentionArgs& args);

// The whole call: OpenMP threads over (sequence, query-row tile, K/V head, head group) work items, each run
// by table.attention_tile.
void attention(const KernelTable& table, const AttentionArgs& args);

}  // namespace xmoe::kernels
