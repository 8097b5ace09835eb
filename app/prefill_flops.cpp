#include "prefill_flops.hpp"

#include <algorithm>

#include "llm/arch/layer_shapes.hpp"

namespace xmoe::app {

namespace {

// Query-key pairs of a causal prefill of t positions when each sees at most `window` keys (0 = all).
double causal_pairs(double t, int64_t window) {
  if (window <= 0 || window >= t) return t * (t + 1) / 2;
  const auto w = static_cast<double>(window);
  return w * (w + 1) / 2 + (t - w) * w;  // the first w positions see p + 1 keys, the rest w
}

}  // namespace

double prefill_flops(const llm::ModelConfig& c, int64_t tokens) {
  const llm::LayerShapeFields* shapes = llm::layer_shape_fields(c);
  const std::optional<llm::MlaDims> mla_or = shapes ? shapes->mla_dims(c) : std::nullopt;
  // value_or instead of reading through the optional in the loop: GCC 12 warns maybe-uninitialized there
  const bool is_mla = mla_or.has_value();
  const llm::MlaDims mla = mla_or.value_or(llm::MlaDims{});
  const double shared = shapes ? static_cast<double>(shapes->shared_expert_intermediate(c)) : 0.0;
  const double d = static_cast<double>(c.hidden_size), t = static_cast<double>(tokens);
  const double heads = c.num_attention_heads;
  double per_token = 0;  // multiply-adds
  double attention = 0;
  for (int layer = 0; layer < c.num_hidden_layers; ++layer) {
    const double pairs = causal_pairs(t, c.attention_window(layer));
    if (is_mla) {
      const double qk = mla.qk_head(), v = mla.v_head, lora = mla.kv_lora_rank;
      per_token += mla.q_lora_rank > 0 ? d * mla.q_lora_rank + mla.q_lora_rank * heads * qk : d * heads * qk;
      per_token += d * mla.latent_width() + lora * heads * (mla.qk_nope + v) + heads * v * d;
      attention += heads * (qk + v) * pairs;
    } else {
      const double q = heads * c.head_dim, kv = static_cast<double>(c.num_key_value_heads) * c.head_dim;
      per_token += d * q + 2 * d * kv + q * d;
      attention += 2.0 * q * pairs;
    }
    per_token +=
        c.is_sparse_layer(layer)
            ? d * c.num_experts + 3.0 * d * (c.num_experts_per_tok * c.moe_intermediate_size + shared)
            : 3.0 * d * c.intermediate_size;
  }
  return 2.0 * (per_token * t + attention + d * c.vocab_size);
}

}  // namespace xmoe::app
