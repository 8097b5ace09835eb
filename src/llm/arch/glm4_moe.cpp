// Glm4MoeForCausalLM (transformers models/glm4_moe/modeling_glm4_moe.py; GLM-4.5, 4.5-Air, 4.6, 4.7): token
// embeddings; per layer RMSNorm → GQA attention (optional QKV biases, optional q/k RMSNorm per head, RoPE on
// the leading partial_rotary_factor of each head in the rotate_half convention, no o_proj bias) → residual →
// RMSNorm → dense SwiGLU MLP (the first first_k_dense_replace layers) or MoE block (sigmoid router with
// e_score_correction_bias for the choice only, n_group / topk_group group-limited selection, norm_topk_prob,
// routed_scaling_factor — the deepseek_v3 router kind — SwiGLU experts, plus n_shared_experts shared experts
// added to the routed output) → residual; final RMSNorm; lm_head. The multi-token-prediction layers
// (num_nextn_predict_layers, stored as model.layers.<num_hidden_layers + i>.*) are part of the tensor plan
// (init-model and quantize write them as GLM publishes them) but are not loaded: generation does not use
// them.
#include <algorithm>
#include <string>

#include "llm/arch/architecture.hpp"
#include "llm/arch/decoder.hpp"
#include "llm/arch/glm4_moe_chat_template.hpp"
#include "llm/arch/glm4_moe_parts.hpp"
#include "llm/arch/layer_shapes.hpp"
#include "xmoe/error.hpp"

namespace xmoe::llm {

namespace {

// config.json fields only GLM-4.5+ (of the architectures here) has.
struct Glm4MoeFields final : ArchitectureConfig, LayerShapeFields {
  GlmMoeFields moe;
  int64_t shared_expert_intermediate(const ModelConfig& c) const override {
    return c.moe_intermediate_size * moe.n_shared_experts;
  }
  bool use_qk_norm = false;
};

// The tensor-name map of the attention side (the feed-forward side's is in glm4_moe_parts).
DecoderLayerNames decoder_layer_names(int i) {
  const std::string p = glm_layer_prefix(i);
  DecoderLayerNames n;
  n.input_norm = p + "input_layernorm.weight";
  n.post_norm = p + "post_attention_layernorm.weight";
  n.attention.q = p + "self_attn.q_proj";
  n.attention.k = p + "self_attn.k_proj";
  n.attention.v = p + "self_attn.v_proj";
  n.attention.o = p + "self_attn.o_proj";
  n.attention.q_norm = p + "self_attn.q_norm.weight";
  n.attention.k_norm = p + "self_attn.k_norm.weight";
  return n;
}
constexpr const char* kEmbed = "model.embed_tokens.weight";
constexpr const char* kFinalNorm = "model.norm.weight";
constexpr const char* kLmHead = "lm_head.weight";

// One decoder layer's tensors in module order (input norm, attention, post norm, MLP or MoE block).
void add_layer(std::vector<PlannedTensor>& t, const ModelConfig& c, int i, ExpertLayout layout) {
  constexpr TensorRole kQuant = TensorRole::quantized_linear;
  const Glm4MoeFields& f = c.arch<Glm4MoeFields>();
  const int64_t H = c.hidden_size, D = c.head_dim;
  const int64_t q_dim = int64_t{c.num_attention_heads} * D, kv_dim = int64_t{c.num_key_value_heads} * D;
  const DecoderLayerNames n = decoder_layer_names(i);
  t.push_back(constant_tensor(n.input_norm, {H}, TensorInit::ones));
  t.push_back(random_tensor(n.attention.q + ".weight", {q_dim, H}, kQuant));
  if (c.attention_bias) t.push_back(constant_tensor(n.attention.q + ".bias", {q_dim}, TensorInit::zeros));
  t.push_back(random_tensor(n.attention.k + ".weight", {kv_dim, H}, kQuant));
  if (c.attention_bias) t.push_back(constant_tensor(n.attention.k + ".bias", {kv_dim}, TensorInit::zeros));
  t.push_back(random_tensor(n.attention.v + ".weight", {kv_dim, H}, kQuant));
  if (c.attention_bias) t.push_back(constant_tensor(n.attention.v + ".bias", {kv_dim}, TensorInit::zeros));
  t.push_back(random_tensor(n.attention.o + ".weight", {H, q_dim}, kQuant));
  if (f.use_qk_norm) {
    t.push_back(constant_tensor(n.attention.q_norm, {D}, TensorInit::ones));
    t.push_back(constant_tensor(n.attention.k_norm, {D}, TensorInit::ones));
  }
  t.push_back(constant_tensor(n.post_norm, {H}, TensorInit::ones));
  add_glm_feed_forward(t, c, f.moe, i, layout);
}

class Glm4Moe final : public Architecture {
 public:
  std::string_view name() const override { return "Glm4MoeForCausalLM"; }
  std::string_view model_type() const override { return "glm4_moe"; }

  void parse_config(const FieldReader& r, ModelConfig& c) const override {
    // transformers' Glm4MoeConfig (v5) defaults (GLM-4.5-Air's sizes).
    DecoderDefaults d;
    d.vocab_size = 151552;
    d.hidden_size = 4096;
    d.intermediate_size = 10944;
    d.moe_intermediate_size = 1408;
    d.num_hidden_layers = 46;
    d.num_attention_heads = 96;
    d.num_key_value_heads = 8;
    d.num_experts_per_tok = 8;
    d.rms_norm_eps = 1e-5;
    d.rope_theta = 10000.0;
    d.max_position_embeddings = 131072;
    // Glm4MoeConfig names the expert count n_routed_experts (num_local_experts is its alias); num_experts
    // is not one of its fields.
    XMOE_CHECK(!r.has("num_experts"), r.field("num_experts"),
               " is not a Glm4MoeConfig field (GLM counts its routed experts in n_routed_experts)");
    for (const char* key : {"mlp_only_layers", "decoder_sparse_step"})
      XMOE_CHECK(!r.has(key), r.field(key),
                 " is not a Glm4MoeConfig field (GLM's dense layers are the first first_k_dense_replace)");
    d.num_experts = static_cast<int>(r.get_int("n_routed_experts", 128, 1, kMaxConfigInt));
    c.partial_rotary_factor = 0.5;  // Glm4MoeConfig's default
    c.norm_topk_prob = true;
    parse_decoder_fields(r, d, c);

    auto f = std::make_shared<Glm4MoeFields>();
    // The first first_k_dense_replace layers are dense (Glm4MoeDecoderLayer), the rest MoE.
    const int dense = static_cast<int>(r.get_int("first_k_dense_replace", 1, 0, kMaxConfigInt));
    for (int i = 0; i < std::min(dense, c.num_hidden_layers); ++i) c.mlp_only_layers.push_back(i);
    parse_moe_fields(r, d, c);
    f->moe = parse_glm_moe_fields(r, c, 1.0, 1);
    f->use_qk_norm = r.get_bool("use_qk_norm", false);
    XMOE_CHECK(!r.has("layer_types") && !r.has("sliding_window"),
               r.field(r.has("layer_types") ? "layer_types" : "sliding_window"),
               " is not supported (GLM-4.5+ attends over the whole context in every layer)");
    c.extension = std::move(f);
  }

  std::vector<PlannedTensor> tensors(const ModelConfig& c, ExpertLayout layout) const override {
    std::vector<PlannedTensor> t;
    t.push_back(random_tensor(kEmbed, {c.vocab_size, c.hidden_size}));
    for (int i = 0; i < c.num_hidden_layers; ++i) add_layer(t, c, i, layout);
    // The MTP layers as GLM publishes them, after the decoder layers: a decoder layer and its own tensors.
    const int mtp = c.arch<Glm4MoeFields>().moe.num_nextn_predict_layers;
    for (int i = c.num_hidden_layers; i < c.num_hidden_layers + mtp; ++i) {
      add_layer(t, c, i, layout);
      add_glm_mtp_extras(t, c, i);
    }
    t.push_back(constant_tensor(kFinalNorm, {c.hidden_size}, TensorInit::ones));
    if (!c.tie_word_embeddings)
      t.push_back(random_tensor(kLmHead, {c.vocab_size, c.hidden_size}, TensorRole::kept_linear));
    return t;
  }

  std::unique_ptr<CausalLM> load(const Checkpoint& checkpoint, const LoadOptions& options) const override {
    const ModelConfig& c = checkpoint.config();
    const Glm4MoeFields& f = c.arch<Glm4MoeFields>();
    DecoderSpec spec;
    spec.embed = kEmbed;
    spec.final_norm = kFinalNorm;
    spec.lm_head = kLmHead;
    spec.attention.qk_norm = f.use_qk_norm;
    spec.attention.qkv_bias = c.attention_bias;  // Glm4MoeAttention's o_proj has no bias
    spec.layer_names = &decoder_layer_names;
    // Only layers [0, num_hidden_layers) are loaded: the MTP layers after them are skipped.
    spec.feed_forward = [c, moe = f.moe](int i, DecoderLoader& loader) {
      return load_glm_feed_forward(loader, c, moe, i);
    };
    return load_decoder(checkpoint, options, std::move(spec));
  }

  InitModelSpec init_model_spec(const ModelConfig&) const override {
    return glm_init_model_spec(kGlm4MoeChatTemplate);
  }
};

}  // namespace

const Architecture& glm4_moe_architecture() {
  static const Glm4Moe arch;
  return arch;
}

}  // namespace xmoe::llm
