// Causal attention over paged K/V (kernels/attention.hpp), every instruction-set level this CPU runs, against
// a two-pass softmax in double precision computed from the logical (unpaged) K/V: GQA groups, odd head dims,
// K width ≠ V width and V read from the K rows (MLA's absorbed decode), sliding windows, sinks, bf16 and f32
// storage, block sizes that are and are not multiples of the 16-position chunk, several sequences at
// different positions. Results must be bit-identical for 1 and 2 threads and whether a sequence runs alone
// or in a batch.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/attention.hpp"
#include "kernels/cpu_features.hpp"
#include "kernels/kernels.hpp"
#include "xmoe/error.hpp"

namespace xmoe::kernels {
namespace {

struct Case {
  std::string name;
  int heads, kv_heads, k_dim, v_dim;
  bool v_in_k;  // V is the first v_dim values of each K row (MLA)
  int64_t window;
  bool sinks;
  DType dtype;
  int block_size;
  std::vector<std::pair<int64_t, int64_t>> seqs;  // (pos0, n_q)
  float scale = 0.0f;                             // 0: 1/sqrt(k_dim)
};

// Values the kernel must never use: K/V positions outside every query's range hold them.
constexpr float kGarbage = 1000.0f;

// One call's inputs: the logical K/V per sequence and the same values in shuffled cache blocks.
struct Problem {
  Case c;
  AttentionArgs args;
  std::vector<std::vector<float>> k, v, q;  // per sequence: [pos][kv][k_dim], [pos][kv][v_dim], [n_q][q_ld]
  std::vector<float> sinks;
  std::vector<std::byte> pool;
  std::vector<std::vector<const void*>> k_ptrs, v_ptrs;
  int64_t q_ld = 0, out_ld = 0;

  explicit Problem(const Case& cs, uint32_t seed) : c(cs) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    const int bs = c.block_size, kv = c.kv_heads;
    const size_t es = dtype_size(c.dtype);
    const int64_t k_pos = int64_t{kv} * c.k_dim, v_pos = c.v_in_k ? k_pos : int64_t{kv} * c.v_dim;
    const int64_t k_bytes = bs * k_pos * static_cast<int64_t>(es);
    const int64_t block_bytes = k_bytes + (c.v_in_k ? 0 : bs * v_pos * static_cast<int64_t>(es));
    q_ld = int64_t{c.heads} * c.k_dim + 3;  // row strides wider than the heads, as in a fused qkv buffer
    out_ld = int64_t{c.heads} * c.v_dim + 1;
    int64_t blocks = 0;
    for (auto [pos0, n] : c.seqs) blocks += (pos0 + n + bs - 1) / bs;
    std::vector<int64_t> order(static_cast<size_t>(blocks));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    pool.assign(static_cast<size_t>(blocks * block_bytes), std::byte{0});
    auto store = [&](std::byte* at, float x) {
      if (c.dtype == DType::f32) {
        std::memcpy(at, &x, 4);
      } else {
        const bf16 b(x);
        std::memcpy(at, &b, 2);
      }
    };
    auto stored = [&](float x) { return c.dtype == DType::f32 ? x : static_cast<float>(bf16(x)); };
    int64_t next = 0;
    for (auto [pos0, n] : c.seqs) {
      const int64_t len = pos0 + n, nblocks = (len + bs - 1) / bs;
      const int64_t lo = c.window > 0 ? std::max<int64_t>(0, pos0 - c.window + 1) : 0;
      std::vector<float> ks(static_cast<size_t>(len * k_pos)), vs(static_cast<size_t>(len * kv * c.v_dim));
      for (float& x : ks) x = stored(uni(rng));
      std::vector<const void*> kp, vp;
      for (int64_t j = 0; j < nblocks; ++j) {
        std::byte* kb = pool.data() + order[static_cast<size_t>(next++)] * block_bytes;
        std::byte* vb = c.v_in_k ? kb : kb + k_bytes;
        for (int64_t i = 0; i < bs; ++i) {
          const int64_t p = j * bs + i;
          const bool seen = p >= lo && p < len;
          for (int64_t e = 0; e < k_pos; ++e)
            store(kb + (i * k_pos + e) * static_cast<int64_t>(es),
                  seen ? ks[static_cast<size_t>(p * k_pos + e)] : kGarbage);
          for (int g = 0; g < kv; ++g)
            for (int d = 0; d < c.v_dim; ++d) {
              float& x = vs[static_cast<size_t>((p * kv + g) * c.v_dim + d)];
              if (p < len)
                x = c.v_in_k ? ks[static_cast<size_t>(p * k_pos + g * c.k_dim + d)] : stored(uni(rng));
              if (!c.v_in_k)
                store(vb + (i * v_pos + g * c.v_dim + d) * static_cast<int64_t>(es), seen ? x : kGarbage);
            }
        }
        if (j >= lo / bs) kp.push_back(kb), vp.push_back(vb);
      }
      std::vector<float> qs(static_cast<size_t>(n * q_ld));
      for (float& x : qs) x = uni(rng);
      k.push_back(std::move(ks)), v.push_back(std::move(vs)), q.push_back(std::move(qs));
      k_ptrs.push_back(std::move(kp)), v_ptrs.push_back(std::move(vp));
    }
    for (int h = 0; h < c.heads; ++h) sinks.push_back(2.0f * uni(rng));
    args.heads = c.heads, args.kv_heads = kv, args.k_dim = c.k_dim, args.v_dim = c.v_dim;
    args.scale = c.scale > 0 ? c.scale : 1.0f / std::sqrt(static_cast<float>(c.k_dim));
    args.window = c.window;
    args.sinks = c.sinks ? sinks.data() : nullptr;
    args.q_ld = q_ld, args.q_head_stride = c.k_dim, args.out_ld = out_ld, args.out_head_stride = c.v_dim;
    args.kv_dtype = c.dtype, args.block_size = bs;
    args.k_pos_stride = k_pos, args.k_head_stride = c.k_dim;
    args.v_pos_stride = v_pos, args.v_head_stride = c.v_in_k ? c.k_dim : c.v_dim;
  }

  // Runs sequences `which` in one call with `threads` threads; returns each one's output rows.
  std::vector<std::vector<float>> run(const KernelTable& table, const std::vector<size_t>& which,
                                      int threads) const {
    std::vector<std::vector<float>> out;
    std::vector<AttentionSequence> seqs;
    for (size_t s : which) out.emplace_back(static_cast<size_t>(c.seqs[s].second * out_ld), -7.0f);
    for (size_t i = 0; i < which.size(); ++i) {
      const size_t s = which[i];
      const auto [pos0, n] = c.seqs[s];
      const int64_t lo = c.window > 0 ? std::max<int64_t>(0, pos0 - c.window + 1) : 0;
      seqs.push_back(
          {q[s].data(), out[i].data(), n, pos0, k_ptrs[s].data(), v_ptrs[s].data(), lo / c.block_size});
    }
    AttentionArgs a = args;
    a.seqs = seqs.data(), a.num_seqs = static_cast<int64_t>(seqs.size());
    const int before = omp_get_max_threads();
    omp_set_num_threads(threads);
    attention(table, a);
    omp_set_num_threads(before);
    return out;
  }

  // The oracle: softmax(q·Kᵀ·scale) over the visible positions (and the sink) in double, then × V.
  std::vector<float> expected(size_t s) const {
    const auto [pos0, n] = c.seqs[s];
    const int group = c.heads / c.kv_heads;
    std::vector<float> out(static_cast<size_t>(n * out_ld), -7.0f);
    for (int64_t r = 0; r < n; ++r)
      for (int h = 0; h < c.heads; ++h) {
        const int g = h / group;
        const int64_t pos = pos0 + r, lo = c.window > 0 ? std::max<int64_t>(0, pos - c.window + 1) : 0;
        std::vector<double> logit;
        double mx = c.sinks ? sinks[static_cast<size_t>(h)] : -INFINITY;
        for (int64_t p = lo; p <= pos; ++p) {
          double dot = 0;
          for (int d = 0; d < c.k_dim; ++d)
            dot += double{q[s][static_cast<size_t>(r * q_ld + h * c.k_dim + d)]} *
                   k[s][static_cast<size_t>((p * c.kv_heads + g) * c.k_dim + d)];
          logit.push_back(dot * args.scale);
          mx = std::max(mx, logit.back());
        }
        double sum = c.sinks ? std::exp(sinks[static_cast<size_t>(h)] - mx) : 0.0;
        for (double& x : logit) sum += (x = std::exp(x - mx));
        for (int d = 0; d < c.v_dim; ++d) {
          double acc = 0;
          for (int64_t p = lo; p <= pos; ++p)
            acc += logit[static_cast<size_t>(p - lo)] *
                   v[s][static_cast<size_t>((p * c.kv_heads + g) * c.v_dim + d)];
          out[static_cast<size_t>(r * out_ld + h * c.v_dim + d)] = static_cast<float>(acc / sum);
        }
      }
    return out;
  }
};

const Case kCases[] = {
    {"gqa_f32", 8, 2, 64, 64, false, 0, false, DType::f32, 16, {{0, 37}, {5, 1}, {70, 20}, {100, 1}}},
    {"gqa_bf16_block24", 8, 2, 40, 40, false, 0, false, DType::bf16, 24, {{0, 33}, {47, 2}, {3, 1}}},
    {"odd_dim_window_sinks", 6, 3, 13, 13, false, 9, true, DType::f32, 4, {{0, 30}, {17, 3}, {40, 1}}},
    {"gpt_oss_like", 8, 2, 32, 32, false, 21, true, DType::bf16, 16, {{0, 50}, {33, 1}, {64, 17}}},
    {"k_ne_v_mha", 4, 4, 24, 40, false, 0, false, DType::f32, 32, {{0, 19}, {40, 5}}},
    {"mla_decode_f32", 20, 1, 36, 32, true, 0, false, DType::f32, 16, {{60, 1}, {10, 1}, {0, 9}}, 0.3f},
    {"mla_decode_bf16", 40, 1, 72, 64, true, 0, false, DType::bf16, 16, {{90, 1}}, 0.125f},
    {"qwen3_shape", 32, 4, 128, 128, false, 0, false, DType::bf16, 16, {{0, 70}, {20, 1}}},
    // Blocks of 24 end in 8-position chunks: decode reading the bf16 cache in place (AVX-512, a group of 8,
    // widths of whole vectors) meets rows past a chunk's end.
    {"gqa_bf16_block24_dim32", 8, 1, 32, 32, false, 0, false, DType::bf16, 24, {{0, 30}, {41, 1}, {5, 2}}},
    {"window_sinks_bf16_block24", 8, 2, 64, 48, false, 19, true, DType::bf16, 24, {{0, 40}, {50, 1}}},
};

std::vector<Isa> levels() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::reference, Isa::avx2, Isa::avx512})
    if (isa_supported(detect_cpu_features(), isa)) out.push_back(isa);
  return out;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
  return worst;
}

TEST(PagedAttention, MatchesDoubleOracleOnEveryLevel) {
  uint32_t seed = 1;
  for (const Case& c : kCases) {
    const Problem pr(c, seed++);
    std::vector<size_t> all(c.seqs.size());
    std::iota(all.begin(), all.end(), 0);
    std::vector<std::vector<float>> reference;
    for (Isa isa : levels()) {
      SCOPED_TRACE(c.name + " on " + isa_name(isa));
      const KernelTable& table = kernel_table(isa, detect_cpu_features());
      const auto got = pr.run(table, all, 2);
      for (size_t s = 0; s < all.size(); ++s) {
        const auto want = pr.expected(s);
        // Padding columns of the output rows stay untouched.
        for (int64_t r = 0; r < c.seqs[s].second; ++r)
          EXPECT_EQ(got[s][static_cast<size_t>((r + 1) * pr.out_ld - 1)], -7.0f);
        EXPECT_LT(max_abs_diff(got[s], want), 2e-5f) << "sequence " << s;
      }
      if (isa == Isa::reference)
        reference = got;
      else
        for (size_t s = 0; s < all.size(); ++s) EXPECT_LT(max_abs_diff(got[s], reference[s]), 1e-5f);
    }
  }
}

TEST(PagedAttention, BitIdenticalAcrossThreadsAndBatches) {
  uint32_t seed = 100;
  for (const Case& c : kCases) {
    const Problem pr(c, seed++);
    std::vector<size_t> all(c.seqs.size());
    std::iota(all.begin(), all.end(), 0);
    for (Isa isa : levels()) {
      SCOPED_TRACE(c.name + " on " + isa_name(isa));
      const KernelTable& table = kernel_table(isa, detect_cpu_features());
      const auto two = pr.run(table, all, 2);
      const auto one = pr.run(table, all, 1);
      for (size_t s = 0; s < all.size(); ++s) {
        EXPECT_EQ(std::memcmp(one[s].data(), two[s].data(), one[s].size() * sizeof(float)), 0);
        const auto alone = pr.run(table, {s}, 2);
        EXPECT_EQ(std::memcmp(alone[0].data(), two[s].data(), two[s].size() * sizeof(float)), 0)
            << "sequence " << s << " alone";
      }
    }
  }
}

// A decode row (one query row: on AVX-512 a GQA group of up to 8 queries takes the half-width score path)
// must equal the same row computed inside a prefill chunk (full-width tiles of many rows), bit for bit.
TEST(PagedAttention, ADecodeRowEqualsTheSameRowInsideAChunk) {
  uint32_t seed = 200;
  for (const Case& c : kCases) {
    const Problem pr(c, seed++);
    const auto [pos0, n] = c.seqs[0];
    if (n < 2) continue;
    for (Isa isa : levels()) {
      SCOPED_TRACE(c.name + " on " + isa_name(isa));
      const KernelTable& table = kernel_table(isa, detect_cpu_features());
      const auto whole = pr.run(table, {0}, 2);
      for (const int64_t r : {int64_t{0}, n / 2, n - 1}) {
        std::vector<float> row(static_cast<size_t>(pr.out_ld), -7.0f);
        // The sequence's block pointers start at its first row's window; the check allows that for later
        // rows.
        const int64_t first = c.window > 0 ? std::max<int64_t>(0, pos0 - c.window + 1) / c.block_size : 0;
        AttentionSequence one{pr.q[0].data() + r * pr.q_ld, row.data(),          1,    pos0 + r,
                              pr.k_ptrs[0].data(),          pr.v_ptrs[0].data(), first};
        AttentionArgs a = pr.args;
        a.seqs = &one, a.num_seqs = 1;
        attention(table, a);
        EXPECT_EQ(std::memcmp(row.data(), whole[0].data() + r * pr.out_ld, row.size() * sizeof(float)), 0)
            << "row " << r;
      }
    }
  }
}

TEST(PagedAttention, BadArgumentsAreNamed) {
  const Problem pr(kCases[0], 7);
  AttentionArgs a = pr.args;
  a.kv_heads = 3;
  try {
    check_attention_args(a);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("kv_heads (3)"), std::string::npos) << e.what();
  }
  a = pr.args;
  a.kv_dtype = DType::f64;
  EXPECT_THROW(check_attention_args(a), Error);
  a = pr.args;
  AttentionSequence s{};
  s.n_q = 1;
  a.seqs = &s, a.num_seqs = 1;
  EXPECT_THROW(check_attention_args(a), Error);
}

}  // namespace
}  // namespace xmoe::kernels
