#include "llm/layers/attention.hpp"

#include <algorithm>

#include "xmoe/error.hpp"

namespace xmoe::llm {

void write_kv(KvCache& cache, int layer, SequenceId seq, int64_t start, int64_t n, const float* k,
              const float* v, int64_t ld) {
  const int bs = cache.block_size();
  const int64_t row = static_cast<int64_t>(cache.shape().num_kv_heads) * cache.shape().head_dim;
  XMOE_CHECK(start + n <= cache.capacity(seq), "attention: sequence ", seq, " has room for ",
             cache.capacity(seq), " tokens, needs ", start + n, " (reserve first)");
  for (int64_t i = 0; i < n; ++i) {
    const int64_t p = start + i;
    const int32_t block = cache.block_of(seq, layer, p);
    const int64_t at = (p % bs) * row;
    if (cache.dtype() == DType::f32) {
      std::copy(k + i * ld, k + i * ld + row, static_cast<float*>(cache.key_block(layer, block)) + at);
      std::copy(v + i * ld, v + i * ld + row, static_cast<float*>(cache.value_block(layer, block)) + at);
    } else {
      bf16* kd = static_cast<bf16*>(cache.key_block(layer, block)) + at;
      bf16* vd = static_cast<bf16*>(cache.value_block(layer, block)) + at;
      for (int64_t j = 0; j < row; ++j) kd[j] = bf16(k[i * ld + j]), vd[j] = bf16(v[i * ld + j]);
    }
  }
}

}  // namespace xmoe::llm
