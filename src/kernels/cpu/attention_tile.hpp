// The attention work item (kernels/attention.hpp) once for every instruction-set level: the walk over K/V
// chunks, masking and the online softmax's bookkeeping live here; the level supplies `Ops` with the three
// inner loops (scores, softmax step, probabilities × V) and kLanes. Included only by attention_<isa>.cpp, so
// each instantiation is compiled with that level's flags.
//
// Layout of one chunk of kAttentionChunk positions: the item's M query rows (row-major over (query row,
// head)) are held transposed, Qt[d][i], so the scores come out as Sᵀ[p][i] with the query index along the
// vector lanes: every row's max, sum and rescale is a vertical (lane-wise) operation and every score a single
// FMA chain over d, the same whatever the lane, tile or thread a row lands in (the determinism contract).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "kernels/attention.hpp"
#include "xmoe/dtype.hpp"

// Internal linkage throughout: each including file is compiled with its own level's flags, and one shared
// out-of-line copy would let the linker hand a baseline caller an AVX-512 body.
namespace xmoe::kernels::attention_detail {
namespace {

constexpr int64_t kPad = 16;  // every scratch width is a multiple of this many floats (64 bytes)

inline int64_t round_up(int64_t n, int64_t to) {
  return (n + to - 1) / to * to;
}

// Where the parts of an item's scratch lie (attention_scratch_floats sums the same sizes).
struct ScratchLayout {
  int64_t mp = 0, dvp = 0;  // query rows and V width, padded to kPad
  float *qt = nullptr, *s = nullptr, *m = nullptr, *l = nullptr, *alpha = nullptr, *o = nullptr,
        *kf = nullptr, *vf = nullptr;
  size_t floats = 0;

  ScratchLayout(const AttentionArgs& a, int64_t query_rows, float* base) {
    mp = round_up(query_rows, kPad);
    dvp = round_up(a.v_dim, kPad);
    const int64_t dk = round_up(a.k_dim, kPad);
    float** parts[] = {&qt, &s, &m, &l, &alpha, &o, &kf, &vf};
    const int64_t sizes[] = {a.k_dim * mp,         kAttentionChunk * mp, mp, mp, mp, query_rows * dvp,
                             kAttentionChunk * dk, kAttentionChunk * dvp};
    int64_t at = 0;
    for (size_t i = 0; i < std::size(sizes); ++i) {
      if (base) *parts[i] = base + at;
      at += round_up(sizes[i], kPad);
    }
    floats = static_cast<size_t>(at);
  }
};

// dst[j] = f32(src[j]) for j in [from, to): bf16 is the upper half of an f32.
inline void widen_bf16(const uint16_t* src, float* dst, int64_t from, int64_t to) {
  for (int64_t j = from; j < to; ++j) {
    const uint32_t bits = uint32_t{src[j]} << 16;
    std::memcpy(dst + j, &bits, sizeof bits);
  }
}

// rows [0, count) of dst [kAttentionChunk, width_padded] = the chunk's rows (`stride` elements apart) as f32;
// the padding columns and the rows past count are zero. Widen(src, dst, n) converts n bf16 values.
template <class Widen>
void load_rows(const void* src, DType dtype, int64_t count, int64_t stride, int width, int64_t width_padded,
               float* dst, Widen widen) {
  for (int64_t p = 0; p < kAttentionChunk; ++p) {
    float* d = dst + p * width_padded;
    if (p >= count) {
      std::fill(d, d + width_padded, 0.0f);
      continue;
    }
    if (dtype == DType::f32) {
      std::memcpy(d, static_cast<const float*>(src) + p * stride, sizeof(float) * static_cast<size_t>(width));
    } else {
      widen(reinterpret_cast<const uint16_t*>(static_cast<const bf16*>(src) + p * stride), d, width);
    }
    std::fill(d + width, d + width_padded, 0.0f);
  }
}

// The K and V rows of one chunk (`count` positions from `k_rows` / `v_rows`) into L2, a line at a time. A
// chunk's rows lie in one cache block, and blocks lie anywhere, so the hardware prefetchers start cold at
// every block; asked for one chunk ahead, decode of 16 sequences at a context of 2048 (K/V from DRAM) went
// 8.6 → 5.0 ms a layer (bench_attention, 2 threads, Zen 4), and 16 × 512 (from L3) 1.33 → 0.97 ms. Into L1
// instead (T0) it was slower than none.
inline void prefetch_chunk(const std::byte* k_rows, const std::byte* v_rows, int64_t count,
                           size_t k_pos_bytes, size_t v_pos_bytes, size_t k_bytes, size_t v_bytes) {
  for (int64_t p = 0; p < count; ++p) {
    const std::byte* k = k_rows + static_cast<size_t>(p) * k_pos_bytes;
    const std::byte* v = v_rows + static_cast<size_t>(p) * v_pos_bytes;
    for (size_t off = 0; off < k_bytes; off += 64) __builtin_prefetch(k + off, 0, 2);
    for (size_t off = 0; off < v_bytes; off += 64) __builtin_prefetch(v + off, 0, 2);
  }
}

template <class Ops>
void attention_tile(const AttentionArgs& a, const AttentionItem& item, float* scratch) {
  const AttentionSequence& sq = a.seqs[item.seq];
  const int hc = item.head_count;
  const int64_t M = item.rows * hc;
  const ScratchLayout sl(a, M, scratch);
  const int64_t mp = sl.mp, dvp = sl.dvp, dk_pad = round_up(a.k_dim, kPad);
  const int64_t lanes = round_up(M, Ops::kLanes);  // columns the vector loops cover
  const int kv_head = item.head0 / (a.heads / a.kv_heads);
  const int64_t bs = a.block_size;
  const size_t esize = dtype_size(a.kv_dtype);

  // Qt[d][i] for query i = (row r, head h) = r·hc + h; padding columns zero. Written row by row of Qt (a
  // query at a time wrote one float per 64-byte line, and decode's items are a single row of heads: it took
  // a tenth of their time).
  std::fill(sl.qt, sl.qt + a.k_dim * mp, 0.0f);
  for (int d = 0; d < a.k_dim; ++d) {
    float* qt_row = sl.qt + d * mp;
    for (int64_t r = 0; r < item.rows; ++r) {
      const float* q = sq.q + (item.row0 + r) * a.q_ld + item.head0 * a.q_head_stride + d;
      for (int h = 0; h < hc; ++h) qt_row[r * hc + h] = q[h * a.q_head_stride];
    }
  }
  // The running max starts at the sink logit (its probability exp(sink − max) is in the sum from the start)
  // or at −inf with an empty sum.
  for (int64_t i = 0; i < mp; ++i) {
    const bool real = i < M && a.sinks;
    sl.m[i] = real ? a.sinks[item.head0 + i % hc] : -std::numeric_limits<float>::infinity();
    sl.l[i] = real ? 1.0f : 0.0f;
  }
  std::fill(sl.o, sl.o + M * dvp, 0.0f);
  // Padding lanes of the scores are computed but never read; zero keeps them finite when qk skips them.
  std::fill(sl.s, sl.s + kAttentionChunk * mp, 0.0f);

  // Levels that can read a bf16 chunk in place do so where it applies (decode of one GQA group).
  constexpr bool kInPlace = Ops::kReadsBf16InPlace;
  bool in_place = false;
  if constexpr (kInPlace) in_place = Ops::reads_bf16_in_place(a, M);
  const int64_t first_pos = sq.pos0 + item.row0, last_pos = first_pos + item.rows - 1;
  auto lowest = [&](int64_t pos) { return a.window > 0 ? std::max<int64_t>(0, pos - a.window + 1) : 0; };
  const int64_t lo = lowest(first_pos);
  // The item's rows of chunk c (an offset into block j, whose K and V blocks are kb and vb).
  const auto rows_at = [&](const std::byte* block, int64_t c, int64_t pos_stride, int64_t head_stride) {
    return block + esize * static_cast<size_t>(c * pos_stride + kv_head * head_stride);
  };
  for (int64_t j = lo / bs; j <= last_pos / bs; ++j) {
    const auto* kb = static_cast<const std::byte*>(sq.k_blocks[j - sq.first_block]);
    const auto* vb = static_cast<const std::byte*>(sq.v_blocks[j - sq.first_block]);
    for (int64_t c = 0; c < bs; c += kAttentionChunk) {
      const int64_t c0 = j * bs + c, count = std::min<int64_t>(kAttentionChunk, bs - c);
      if (c0 + count <= lo || c0 > last_pos) continue;
      const std::byte* k_rows = rows_at(kb, c, a.k_pos_stride, a.k_head_stride);
      const std::byte* v_rows = rows_at(vb, c, a.v_pos_stride, a.v_head_stride);
      // The next chunk: later in this block, or the next block's first.
      const int64_t nc = c + kAttentionChunk < bs ? c + kAttentionChunk : 0, nj = nc == 0 ? j + 1 : j;
      if (nj <= last_pos / bs) {
        const auto* nkb = static_cast<const std::byte*>(sq.k_blocks[nj - sq.first_block]);
        const auto* nvb = static_cast<const std::byte*>(sq.v_blocks[nj - sq.first_block]);
        prefetch_chunk(
            rows_at(nkb, nc, a.k_pos_stride, a.k_head_stride),
            rows_at(nvb, nc, a.v_pos_stride, a.v_head_stride), std::min<int64_t>(kAttentionChunk, bs - nc),
            esize * static_cast<size_t>(a.k_pos_stride), esize * static_cast<size_t>(a.v_pos_stride),
            esize * static_cast<size_t>(a.k_dim), esize * static_cast<size_t>(a.v_dim));
      }
      if (in_place) {
        if constexpr (kInPlace)
          Ops::qk_bf16(sl.qt, mp, reinterpret_cast<const uint16_t*>(k_rows), a.k_pos_stride, count, a.k_dim,
                       a.scale, sl.s);
      } else {
        load_rows(k_rows, a.kv_dtype, count, a.k_pos_stride, a.k_dim, dk_pad, sl.kf, Ops::widen);
        load_rows(v_rows, a.kv_dtype, count, a.v_pos_stride, a.v_dim, dvp, sl.vf, Ops::widen);
        Ops::qk(sl.qt, mp, M, lanes, sl.kf, dk_pad, a.k_dim, a.scale, sl.s);
      }
      // Positions a query may not see: after it (causal), before its window, past the block's end.
      for (int64_t r = 0; r < item.rows; ++r) {
        const int64_t pos = first_pos + r;
        const int64_t from = std::clamp<int64_t>(lowest(pos) - c0, 0, kAttentionChunk);
        const int64_t to = std::clamp<int64_t>(std::min(pos + 1 - c0, count), 0, kAttentionChunk);
        if (from == 0 && to == kAttentionChunk) continue;
        for (int64_t p = 0; p < kAttentionChunk; ++p) {
          if (p >= from && p < to) continue;
          for (int h = 0; h < hc; ++h) sl.s[p * mp + r * hc + h] = -std::numeric_limits<float>::infinity();
        }
      }
      Ops::softmax_step(sl.s, mp, lanes, sl.m, sl.l, sl.alpha);
      for (int64_t i = 0; i < M; ++i)
        if (sl.alpha[i] != 1.0f) Ops::scale_row(sl.o + i * dvp, sl.alpha[i], dvp);
      if (in_place) {
        if constexpr (kInPlace)
          Ops::pv_bf16(sl.s, mp, M, reinterpret_cast<const uint16_t*>(v_rows), a.v_pos_stride, count, dvp,
                       sl.o);
      } else {
        Ops::pv(sl.s, mp, M, sl.vf, dvp, sl.o);
      }
    }
  }
  for (int64_t r = 0; r < item.rows; ++r)
    for (int h = 0; h < hc; ++h) {
      const int64_t i = r * hc + h;
      float* out = sq.out + (item.row0 + r) * a.out_ld + (item.head0 + h) * a.out_head_stride;
      const float inv = 1.0f / sl.l[i];
      for (int d = 0; d < a.v_dim; ++d) out[d] = sl.o[i * dvp + d] * inv;
    }
}

}  // namespace
}  // namespace xmoe::kernels::attention_detail
