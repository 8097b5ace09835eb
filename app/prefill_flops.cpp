#include "prefill_flops.hpp"

namespace xmoe::app {

double prefill_flops(const llm::ModelConfig& c, int64_t tokens) {
  const double d = static_cast<double>(c.hidden_size), hd = c.head_dim;
  const double q = c.num_attention_heads * hd, kv = c.num_key_value_heads * hd;
  const double t = static_cast<double>(tokens);
  double per_token = 0;  // multiply-adds
  double attention = 0;
  for (int layer = 0; layer < c.num_hidden_layers; ++layer) {
    per_token += d * q + 2 * d * kv + q * d;
    per_token += c.is_sparse_layer(layer)
                     ? d * c.num_experts + c.num_experts_per_tok * 3.0 * d * c.moe_intermediate_size
                     : 3.0 * d * c.intermediate_size;
    // Position p attends to p + 1 keys: scores and the weighted sum of values, per query head.
    attention += 2.0 * q * (t * (t + 1) / 2);
  }
  return 2.0 * (per_token * t + attention + d * c.vocab_size);
}

}  // namespace xmoe::app
