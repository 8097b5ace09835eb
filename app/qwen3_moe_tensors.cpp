#include "qwen3_moe_tensors.hpp"

#include "xmoe/error.hpp"

namespace xmoe::app {

namespace {

// Each config size is in range on its own, but their products can overflow: name the tensor instead.
int64_t checked_product(const std::string& name, const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    XMOE_CHECK(!__builtin_mul_overflow(n, d, &n), "init-model: tensor '", name, "' would be too large");
  return n;
}

PlannedTensor random(std::string name, std::vector<int64_t> shape) {
  PlannedTensor t{std::move(name), std::move(shape), TensorInit::normal, {}};
  t.segments.push_back({t.name, t.numel()});
  return t;
}

PlannedTensor constant(std::string name, std::vector<int64_t> shape, TensorInit init) {
  return PlannedTensor{std::move(name), std::move(shape), init, {}};
}

}  // namespace

int64_t PlannedTensor::numel() const { return checked_product(name, shape); }

std::vector<PlannedTensor> qwen3_moe_tensors(const llm::ModelConfig& c, ExpertLayout layout) {
  const int64_t H = c.hidden_size, D = c.head_dim, E = c.num_experts, I = c.moe_intermediate_size;
  const int64_t q_dim = int64_t{c.num_attention_heads} * D, kv_dim = int64_t{c.num_key_value_heads} * D;
  std::vector<PlannedTensor> t;
  t.push_back(random("model.embed_tokens.weight", {c.vocab_size, H}));
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    t.push_back(constant(p + "input_layernorm.weight", {H}, TensorInit::ones));
    t.push_back(random(p + "self_attn.q_proj.weight", {q_dim, H}));
    t.push_back(random(p + "self_attn.k_proj.weight", {kv_dim, H}));
    t.push_back(random(p + "self_attn.v_proj.weight", {kv_dim, H}));
    t.push_back(random(p + "self_attn.o_proj.weight", {H, q_dim}));
    if (c.attention_bias) {
      // transformers initialises Linear biases to zero.
      t.push_back(constant(p + "self_attn.q_proj.bias", {q_dim}, TensorInit::zeros));
      t.push_back(constant(p + "self_attn.k_proj.bias", {kv_dim}, TensorInit::zeros));
      t.push_back(constant(p + "self_attn.v_proj.bias", {kv_dim}, TensorInit::zeros));
      t.push_back(constant(p + "self_attn.o_proj.bias", {H}, TensorInit::zeros));
    }
    t.push_back(constant(p + "self_attn.q_norm.weight", {D}, TensorInit::ones));
    t.push_back(constant(p + "self_attn.k_norm.weight", {D}, TensorInit::ones));
    t.push_back(constant(p + "post_attention_layernorm.weight", {H}, TensorInit::ones));
    if (c.is_sparse_layer(i)) {
      t.push_back(random(p + "mlp.gate.weight", {E, H}));
      auto expert = [&](int64_t j, const char* proj) {
        return p + "mlp.experts." + std::to_string(j) + "." + proj + ".weight";
      };
      if (layout == ExpertLayout::per_expert) {
        for (int64_t j = 0; j < E; ++j) {
          t.push_back(random(expert(j, "gate_proj"), {I, H}));
          t.push_back(random(expert(j, "up_proj"), {I, H}));
          t.push_back(random(expert(j, "down_proj"), {H, I}));
        }
      } else {
        PlannedTensor gate_up{p + "mlp.experts.gate_up_proj", {E, 2 * I, H}, TensorInit::normal, {}};
        PlannedTensor down{p + "mlp.experts.down_proj", {E, H, I}, TensorInit::normal, {}};
        const int64_t per_expert = checked_product(expert(0, "down_proj"), {H, I});
        for (int64_t j = 0; j < E; ++j) {
          gate_up.segments.push_back({expert(j, "gate_proj"), per_expert});
          gate_up.segments.push_back({expert(j, "up_proj"), per_expert});
          down.segments.push_back({expert(j, "down_proj"), per_expert});
        }
        t.push_back(std::move(gate_up));
        t.push_back(std::move(down));
      }
    } else {
      const int64_t F = c.intermediate_size;
      t.push_back(random(p + "mlp.gate_proj.weight", {F, H}));
      t.push_back(random(p + "mlp.up_proj.weight", {F, H}));
      t.push_back(random(p + "mlp.down_proj.weight", {H, F}));
    }
  }
  t.push_back(constant("model.norm.weight", {H}, TensorInit::ones));
  if (!c.tie_word_embeddings) t.push_back(random("lm_head.weight", {c.vocab_size, H}));
  return t;
}

}  // namespace xmoe::app
