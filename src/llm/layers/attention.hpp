// Causal GQA attention over the paged KV cache, as transformers' eager attention: softmax(q·Kᵀ·scale) in f32,
// then the probabilities times V. Options: a sliding window (the query sees its last `window` positions,
// itself included) and a learned sink logit per head that joins the softmax denominator only (transformers'
// gpt_oss eager_attention_forward: max over the logits and the sink, probabilities exp(s - max) / (Σ exp(s -
// max) + exp(sink - max)), the sink's own column dropped).
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/kernels.hpp"
#include "llm/kv_cache.hpp"

namespace xmoe::llm {

struct AttentionDims {
  int heads = 0, kv_heads = 0, head_dim = 0;
  float scale = 1.0f;
  int64_t window = 0;            // 0: every position up to the query's
  const float* sinks = nullptr;  // [heads] sink logits, or none
};

// Stores the K and V rows ([n, kv_heads · head_dim] f32, converted to the cache dtype) of positions
// [start, start + n) of `seq` in layer `layer`. A sliding layer's ring keeps the newest positions: n must
// not exceed cache.max_append(layer) when the queries of the same positions attend afterwards.
void write_kv(KvCache& cache, int layer, SequenceId seq, int64_t start, int64_t n, const float* k,
              const float* v, int64_t ld);

// One query head of one token at `position`: attends over the cached positions [max(0, position - window +
// 1), position] of `seq`. scratch grows to the number of positions. out: head_dim f32.
void attend(const kernels::KernelTable& table, KvCache& cache, int layer, SequenceId seq, int64_t position,
            int head, const AttentionDims& dims, const float* q, float* out, std::vector<float>& scratch);

}  // namespace xmoe::llm
