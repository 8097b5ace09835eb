// Writing a step's K/V rows into the paged cache; the attention over them is kernels::attention
// (kernels/attention.hpp).
#pragma once
#include <cstdint>

#include "llm/kv_cache.hpp"

namespace xmoe::llm {

// Stores the K and V rows ([n, kv_heads · head_dim] f32, converted to the cache dtype) of positions
// [start, start + n) of `seq` in layer `layer`. A sliding layer's ring keeps the newest positions: n must
// not exceed cache.max_append(layer) when the queries of the same positions attend afterwards.
void write_kv(KvCache& cache, int layer, SequenceId seq, int64_t start, int64_t n, const float* k,
              const float* v, int64_t ld);

}  // namespace xmoe::llm
