// Causal GQA attention over the paged KV cache, as transformers' eager attention: softmax(q·Kᵀ·scale) in f32,
// then the probabilities times V.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/kernels.hpp"
#include "llm/kv_cache.hpp"

namespace xmoe::llm {

struct AttentionDims {
  int heads = 0, kv_heads = 0, head_dim = 0;
  float scale = 1.0f;
};

// Stores the K and V rows ([n, kv_heads · head_dim] f32, converted to the cache dtype) of positions
// [start, start + n) of `seq` in layer `layer`.
void write_kv(KvCache& cache, int layer, SequenceId seq, int64_t start, int64_t n, const float* k,
              const float* v, int64_t ld);

// One query head of one token at `position`: attends over the cached positions [0, position] of `seq`.
// scratch grows to position + 1 floats. out: head_dim f32.
void attend(const kernels::KernelTable& table, KvCache& cache, int layer, SequenceId seq, int64_t position,
            int head, const AttentionDims& dims, const float* q, float* out, std::vector<float>& scratch);

}  // namespace xmoe::llm
