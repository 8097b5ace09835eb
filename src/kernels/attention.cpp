#include "kernels/attention.hpp"

#include <omp.h>

#include <algorithm>
#include <vector>

#include "kernels/cpu/attention_tile.hpp"
#include "kernels/kernels.hpp"
#include "util/buffer.hpp"
#include "xmoe/error.hpp"

namespace xmoe::kernels {

namespace {

// Query rows (rows × heads) per work item: enough to spread each K/V chunk's conversion over many rows while
// the item's transposed queries and output stay in L2.
constexpr int64_t kItemQueries = 128;
// Work (multiply-adds of q·k and p·v) below which the items run on the calling thread: one thread does this
// in ~20-40 us (one decode token at a context of 64-128), about what waking the team costs, and far less than
// that costs when the machine is loaded (a waiting worker is not running).
constexpr double kAloneMacs = 1 << 20;
// Heads are split below a whole group only down to this many, and only when the whole-group items are too
// few to occupy the threads (decode of a few sequences with one shared K/V head, as MLA).
constexpr int kMinHeadsPerItem = 8;

}  // namespace

size_t attention_scratch_floats(const AttentionArgs& args, int64_t query_rows) {
  return attention_detail::ScratchLayout(args, query_rows, nullptr).floats;
}

void check_attention_args(const AttentionArgs& a) {
  XMOE_CHECK(a.heads > 0 && a.kv_heads > 0 && a.heads % a.kv_heads == 0, "attention: heads (", a.heads,
             ") must be a positive multiple of kv_heads (", a.kv_heads, ")");
  XMOE_CHECK(a.k_dim > 0 && a.v_dim > 0, "attention: k_dim (", a.k_dim, ") and v_dim (", a.v_dim,
             ") must be > 0");
  XMOE_CHECK(a.kv_dtype == DType::f32 || a.kv_dtype == DType::bf16,
             "attention: K/V dtype must be f32 or bf16, got ", dtype_name(a.kv_dtype));
  XMOE_CHECK(a.block_size > 0, "attention: block_size must be > 0, got ", a.block_size);
  XMOE_CHECK(a.window >= 0, "attention: window must be >= 0, got ", a.window);
  XMOE_CHECK(
      a.k_pos_stride >= a.k_dim && a.v_pos_stride >= a.v_dim && a.k_head_stride >= 0 && a.v_head_stride >= 0,
      "attention: K/V strides (", a.k_pos_stride, ", ", a.v_pos_stride, ") must cover k_dim and v_dim");
  XMOE_CHECK(a.q_ld >= 0 && a.out_ld >= 0 && a.q_head_stride >= 0 && a.out_head_stride >= 0,
             "attention: q/out strides must be >= 0");
  XMOE_CHECK(a.num_seqs >= 0 && (a.num_seqs == 0 || a.seqs), "attention: ", a.num_seqs,
             " sequences but no sequence array");
  for (int64_t s = 0; s < a.num_seqs; ++s) {
    const AttentionSequence& sq = a.seqs[s];
    XMOE_CHECK(sq.n_q >= 0 && sq.pos0 >= 0, "attention: sequence ", s, " has n_q ", sq.n_q, " and pos0 ",
               sq.pos0, " (must be >= 0)");
    if (sq.n_q == 0) continue;
    XMOE_CHECK(sq.q && sq.out && sq.k_blocks && sq.v_blocks, "attention: sequence ", s,
               " lacks q, out or its K/V block pointers");
    const int64_t lo = a.window > 0 ? std::max<int64_t>(0, sq.pos0 - a.window + 1) : 0;
    XMOE_CHECK(sq.first_block >= 0 && sq.first_block <= lo / a.block_size, "attention: sequence ", s,
               "'s block pointers start at block ", sq.first_block, " but it attends from position ", lo);
  }
}

void attention(const KernelTable& table, const AttentionArgs& a) {
  check_attention_args(a);
  const int group = a.heads / a.kv_heads;
  const int64_t tile_rows = std::max<int64_t>(1, kItemQueries / group);
  int64_t tiles = 0;
  for (int64_t s = 0; s < a.num_seqs; ++s) tiles += (a.seqs[s].n_q + tile_rows - 1) / tile_rows;
  // Any split gives the same results (attention.hpp), so it may follow the thread count.
  const int threads = omp_get_max_threads();
  int heads_per_item = group;
  while (heads_per_item > kMinHeadsPerItem &&
         tiles * a.kv_heads * ((group + heads_per_item - 1) / heads_per_item) < 2 * threads)
    heads_per_item = (heads_per_item + 1) / 2;

  // The later tiles of a sequence attend over more positions: they go first so the dynamic schedule ends
  // with short items.
  std::vector<AttentionItem> items;
  int64_t most_queries = 0;
  for (int64_t s = 0; s < a.num_seqs; ++s) {
    const int64_t n = a.seqs[s].n_q;
    for (int64_t row0 = (n - 1) / tile_rows * tile_rows; row0 >= 0 && n > 0; row0 -= tile_rows)
      for (int g = 0; g < a.kv_heads; ++g)
        for (int h = 0; h < group; h += heads_per_item) {
          const AttentionItem it{s, row0, std::min(tile_rows, n - row0), g * group + h,
                                 std::min(heads_per_item, group - h)};
          most_queries = std::max(most_queries, it.rows * it.head_count);
          items.push_back(it);
        }
  }
  const size_t scratch_floats = attention_scratch_floats(a, most_queries);
  const auto count = static_cast<int64_t>(items.size());
  double macs = 0;
  for (const AttentionItem& it : items) {
    const AttentionSequence& sq = a.seqs[it.seq];
    const int64_t last = sq.pos0 + it.row0 + it.rows;  // positions the item's last row sees, window aside
    macs += static_cast<double>(it.rows * it.head_count) * static_cast<double>(last) * (a.k_dim + a.v_dim);
  }
#pragma omp parallel if (count > 1 && macs > kAloneMacs)
  {
    Buffer<float> scratch;
    float* buffer = scratch.ensure(scratch_floats);
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < count; ++i) table.attention_tile(a, items[static_cast<size_t>(i)], buffer);
  }
}

}  // namespace xmoe::kernels
