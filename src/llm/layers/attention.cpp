#include "llm/layers/attention.hpp"

#include <algorithm>
#include <cmath>

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

void attend(const kernels::KernelTable& table, KvCache& cache, int layer, SequenceId seq, int64_t position,
            int head, const AttentionDims& dims, const float* q, float* out, std::vector<float>& scratch) {
  const int bs = cache.block_size();
  const int D = dims.head_dim;
  const int g = head / (dims.heads / dims.kv_heads);  // the KV head this query head shares
  const int64_t row = static_cast<int64_t>(dims.kv_heads) * D, n = position + 1;
  const int64_t first = dims.window > 0 ? std::max<int64_t>(0, n - dims.window) : 0;
  const bool f32 = cache.dtype() == DType::f32;
  scratch.resize(static_cast<size_t>(n - first));
  float* s = scratch.data() - first;  // s[p] for p in [first, n)

  // Positions run block by block; a block's rows are positions [p0, p0 + bs).
  for (int64_t p0 = first - first % bs; p0 < n; p0 += bs) {
    const void* kb = cache.key_block(layer, cache.block_of(seq, layer, p0));
    for (int64_t p = std::max(p0, first); p < std::min(n, p0 + bs); ++p) {
      const int64_t at = (p - p0) * row + static_cast<int64_t>(g) * D;
      const float dot = f32 ? table.dot_f32(static_cast<const float*>(kb) + at, q, D)
                            : table.dot_bf16_f32(static_cast<const bf16*>(kb) + at, q, D);
      s[p] = dot * dims.scale;
    }
  }
  float m = -INFINITY;
  for (int64_t p = first; p < n; ++p) m = std::max(m, s[p]);
  const float sink = dims.sinks ? dims.sinks[head] : 0.0f;
  if (dims.sinks) m = std::max(m, sink);
  float sum = 0;
  for (int64_t p = first; p < n; ++p) sum += (s[p] = std::exp(s[p] - m));
  if (dims.sinks) sum += std::exp(sink - m);
  const float inv = 1.0f / sum;
  std::fill(out, out + D, 0.0f);
  for (int64_t p0 = first - first % bs; p0 < n; p0 += bs) {
    const void* vb = cache.value_block(layer, cache.block_of(seq, layer, p0));
    for (int64_t p = std::max(p0, first); p < std::min(n, p0 + bs); ++p) {
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
