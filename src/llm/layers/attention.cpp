#include "llm/layers/attention.hpp"

#include <algorithm>
#include <cmath>

#include "xmoe/error.hpp"

namespace xmoe::llm {

void write_kv(KvCache& cache, int layer, SequenceId seq, int64_t start, int64_t n, const float* k,
              const float* v, int64_t ld) {
  const std::vector<int32_t>& table = cache.block_table(seq);
  const int bs = cache.block_size();
  const int64_t row = static_cast<int64_t>(cache.shape().num_kv_heads) * cache.shape().head_dim;
  XMOE_CHECK(start + n <= static_cast<int64_t>(table.size()) * bs, "attention: sequence ", seq,
             " has room for ", table.size() * static_cast<size_t>(bs), " tokens, needs ", start + n,
             " (reserve first)");
  for (int64_t i = 0; i < n; ++i) {
    const int64_t p = start + i;
    const int32_t block = table[static_cast<size_t>(p / bs)];
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

void attend(const kernels::KernelTable& table, KvCache& cache, int layer, SequenceId seq, int64_t position,
            int head, const AttentionDims& dims, const float* q, float* out, std::vector<float>& scratch) {
  const std::vector<int32_t>& blocks = cache.block_table(seq);
  const int bs = cache.block_size();
  const int D = dims.head_dim;
  const int g = head / (dims.heads / dims.kv_heads);  // the KV head this query head shares
  const int64_t row = static_cast<int64_t>(dims.kv_heads) * D, n = position + 1;
  const bool f32 = cache.dtype() == DType::f32;
  scratch.resize(static_cast<size_t>(n));
  float* s = scratch.data();

  for (int64_t p0 = 0; p0 < n; p0 += bs) {
    const int32_t block = blocks[static_cast<size_t>(p0 / bs)];
    const void* kb = cache.key_block(layer, block);
    for (int64_t p = p0; p < std::min(n, p0 + bs); ++p) {
      const int64_t at = (p - p0) * row + static_cast<int64_t>(g) * D;
      const float dot = f32 ? table.dot_f32(static_cast<const float*>(kb) + at, q, D)
                            : table.dot_bf16_f32(static_cast<const bf16*>(kb) + at, q, D);
      s[p] = dot * dims.scale;
    }
  }
  float m = -INFINITY;
  for (int64_t p = 0; p < n; ++p) m = std::max(m, s[p]);
  float sum = 0;
  for (int64_t p = 0; p < n; ++p) sum += (s[p] = std::exp(s[p] - m));
  const float inv = 1.0f / sum;
  std::fill(out, out + D, 0.0f);
  for (int64_t p0 = 0; p0 < n; p0 += bs) {
    const int32_t block = blocks[static_cast<size_t>(p0 / bs)];
    const void* vb = cache.value_block(layer, block);
    for (int64_t p = p0; p < std::min(n, p0 + bs); ++p) {
      const int64_t at = (p - p0) * row + static_cast<int64_t>(g) * D;
      const float w = s[p] * inv;
      if (f32)
        table.axpy_f32(w, static_cast<const float*>(vb) + at, out, D);
      else
        table.axpy_bf16_f32(w, static_cast<const bf16*>(vb) + at, out, D);
    }
  }
}

}  // namespace xmoe::llm
