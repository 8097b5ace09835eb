#include "llm/arch/attention_block.hpp"

#include <algorithm>
#include <cmath>

#include "kernels/linear.hpp"
#include "llm/layers/attention.hpp"
#include "llm/layers/linear_parts.hpp"
#include "llm/layers/rmsnorm.hpp"
#include "moe/parallel.hpp"
#include "xmoe/error.hpp"

namespace xmoe::llm {

namespace {

// y[t, :] += bias for each of T rows of `width` values, `ld` apart.
void add_bias(float* y, const float* bias, int64_t T, int64_t width, int64_t ld) {
  moe::parallel_rows(T, 16, [&](int64_t a, int64_t b) {
    for (int64_t t = a; t < b; ++t)
      for (int64_t j = 0; j < width; ++j) y[t * ld + j] += bias[j];
  });
}

}  // namespace

AttentionBlock::AttentionBlock(const AttentionOptions& options, int heads, int kv_heads, int head_dim,
                               int64_t window, float eps, AttentionWeights weights)
    : options_(options),
      heads_(heads),
      kv_heads_(kv_heads),
      head_dim_(head_dim),
      window_(window),
      eps_(eps),
      w_(std::move(weights)) {
  XMOE_CHECK(heads > 0 && kv_heads > 0 && heads % kv_heads == 0 && head_dim > 0, "attention: heads (", heads,
             ") must be a positive multiple of kv heads (", kv_heads, ") and head_dim > 0");
  const int64_t q_width = int64_t{heads} * head_dim, kv_width = int64_t{kv_heads} * head_dim;
  auto check_len = [](const std::vector<float>& v, int64_t n, bool wanted, const char* what) {
    XMOE_CHECK(wanted ? static_cast<int64_t>(v.size()) == n : v.empty(), "attention: ", what, " has ",
               v.size(), " values, expected ", wanted ? n : 0);
  };
  check_len(w_.q_bias, q_width, options.qkv_bias, "q bias");
  check_len(w_.k_bias, kv_width, options.qkv_bias, "k bias");
  check_len(w_.v_bias, kv_width, options.qkv_bias, "v bias");
  check_len(w_.o_bias, w_.o.rows, options.o_bias, "o bias");
  check_len(w_.q_norm, head_dim, options.qk_norm, "q norm");
  check_len(w_.k_norm, head_dim, options.qk_norm, "k norm");
  check_len(w_.sinks, heads, options.sinks, "sinks");
  qkv_parts_ = {w_.q, w_.k, w_.v};
  if (auto joined = kernels::join_rows(qkv_parts_)) qkv_parts_ = {*joined};
  for (const auto* b : {&w_.q_bias, &w_.k_bias, &w_.v_bias})
    qkv_bias_.insert(qkv_bias_.end(), b->begin(), b->end());
}

size_t AttentionBlock::bytes() const {
  size_t n = w_.o.bytes();
  for (const kernels::PackedWeight& p : qkv_parts_) n += p.bytes();
  n += (qkv_bias_.size() + w_.o_bias.size() + w_.q_norm.size() + w_.k_norm.size() + w_.sinks.size()) *
       sizeof(float);
  return n;
}

void AttentionBlock::forward(const kernels::KernelTable& table, const Rope& rope, const StepRows& step,
                             KvCache& cache, int layer, const float* x, float* out,
                             AttentionScratch& scratch) const {
  XMOE_CHECK(cache.window(layer) == window_, "attention: layer ", layer, " has window ", window_,
             " but the KV cache keeps ", cache.window(layer));
  const int64_t T = step.rows(), D = head_dim_;
  const int Hq = heads_, KV = kv_heads_;
  const int64_t q_width = Hq * D, kv_width = KV * D, qkv_width = q_width + 2 * kv_width;
  const size_t chunks = step.seq.size();
  const auto& first = step.first;
  const auto& start = step.start;
  const auto& chunk_of = step.chunk_of;

  float* qkv = scratch.qkv.ensure(static_cast<size_t>(T * qkv_width));
  {
    double bytes = 0;
    for (const kernels::PackedWeight& w : qkv_parts_) bytes += static_cast<double>(w.bytes());
    ProfileScope scope(
        scratch.profile, ProfileOp::attention_proj, bytes,
        2.0 * static_cast<double>(T) * static_cast<double>(qkv_width) * static_cast<double>(w_.q.cols));
    linear_forward_parts(table, qkv_parts_, x, T, w_.q.cols, qkv, qkv_width);
    if (!qkv_bias_.empty()) add_bias(qkv, qkv_bias_.data(), T, qkv_width, qkv_width);
  }
  // A token's q/k norm and rotation take a few microseconds: a team pays off only from a few dozen rows.
  moe::parallel_rows(T, 32, [&](int64_t a, int64_t b) {
    for (int64_t t = a; t < b; ++t) {
      const auto c = static_cast<size_t>(chunk_of[static_cast<size_t>(t)]);
      const int64_t pos = start[c] + (t - first[c]), seq_len = start[c] + (first[c + 1] - first[c]);
      float* q = qkv + t * qkv_width;
      float* k = q + q_width;
      if (options_.qk_norm) {
        rms_norm_rows(q, q, Hq, D, D, w_.q_norm.data(), eps_);
        rms_norm_rows(k, k, KV, D, D, w_.k_norm.data(), eps_);
      }
      rope.apply(q, Hq, k, KV, pos, seq_len);
    }
  });

  float* attn = scratch.attn.ensure(static_cast<size_t>(T * q_width));
  kernels::AttentionArgs args;
  args.heads = Hq, args.kv_heads = KV, args.k_dim = args.v_dim = static_cast<int>(D);
  args.scale = options_.scale > 0 ? options_.scale : 1.0f / std::sqrt(static_cast<float>(D));
  args.window = window_;
  args.sinks = w_.sinks.empty() ? nullptr : w_.sinks.data();
  args.q_ld = qkv_width, args.q_head_stride = D, args.out_ld = q_width, args.out_head_stride = D;
  args.kv_dtype = cache.dtype();
  args.block_size = cache.block_size();
  args.k_pos_stride = args.v_pos_stride = kv_width, args.k_head_stride = args.v_head_stride = D;
  const int64_t bs = cache.block_size();
  // A full layer writes every new position, then attends (one pass). A sliding layer's ring holds
  // max_append new positions beyond a window, so a long chunk goes in passes of that many tokens.
  const int64_t pass = cache.max_append(layer);
  int64_t longest = 0;
  for (size_t c = 0; c < chunks; ++c) longest = std::max(longest, first[c + 1] - first[c]);
  std::vector<kernels::AttentionSequence> seqs;
  std::vector<const void*> blocks;  // per sequence: its K blocks, then its V blocks, in position order
  std::vector<std::pair<size_t, size_t>> block_span;  // per sequence: where its blocks start, how many
  for (int64_t off = 0; off < longest; off += pass) {
    seqs.clear(), blocks.clear(), block_span.clear();
    for (size_t c = 0; c < chunks; ++c) {
      const int64_t n = first[c + 1] - first[c];
      if (off >= n) continue;
      const int64_t m = std::min(pass, n - off), pos0 = start[c] + off;
      const float* k = qkv + (first[c] + off) * qkv_width + q_width;
      write_kv(cache, layer, step.seq[c], pos0, m, k, k + kv_width, qkv_width);
      const int64_t lo = window_ > 0 ? std::max<int64_t>(0, pos0 - window_ + 1) : 0;
      const int64_t first_block = lo / bs, last_block = (pos0 + m - 1) / bs;
      block_span.emplace_back(blocks.size(), static_cast<size_t>(last_block - first_block + 1));
      for (int which = 0; which < 2; ++which)
        for (int64_t j = first_block; j <= last_block; ++j) {
          const int32_t b = cache.block_of(step.seq[c], layer, j * bs);
          blocks.push_back(which == 0 ? cache.key_block(layer, b) : cache.value_block(layer, b));
        }
      seqs.push_back({qkv + (first[c] + off) * qkv_width, attn + (first[c] + off) * q_width, m, pos0, nullptr,
                      nullptr, first_block});
    }
    for (size_t i = 0; i < seqs.size(); ++i) {
      seqs[i].k_blocks = blocks.data() + block_span[i].first;
      seqs[i].v_blocks = seqs[i].k_blocks + block_span[i].second;
    }
    args.seqs = seqs.data(), args.num_seqs = static_cast<int64_t>(seqs.size());
    kernels::attention(table, args);
  }
  ProfileScope scope(
      scratch.profile, ProfileOp::attention_proj, static_cast<double>(w_.o.bytes()),
      2.0 * static_cast<double>(T) * static_cast<double>(w_.o.rows) * static_cast<double>(w_.o.cols));
  kernels::linear_forward(table, w_.o, attn, T, out);
  if (!w_.o_bias.empty()) add_bias(out, w_.o_bias.data(), T, w_.o.rows, w_.o.rows);
}

}  // namespace xmoe::llm
