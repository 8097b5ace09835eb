// Glm4MoeLiteForCausalLM (transformers models/glm4_moe_lite; GLM-4.7-Flash): GLM-4.5's decoder with
// DeepSeek's multi-head latent attention. Per layer RMSNorm → MLA (llm/arch/mla_attention.hpp: q_lora_rank or
// q_proj, kv_lora_rank latent cached per token, RoPE on qk_rope_head_dim — interleaved pairs when
// rope_interleave — softmax scale qk_head_dim^-0.5 times mscale² under YaRN with mscale_all_dim) → residual →
// RMSNorm → dense SwiGLU or GLM's MoE block (glm4_moe_parts: mlp_layer_types picks which) → residual. MTP
// layers (num_nextn_predict_layers) are planned after the decoder layers and not loaded.
#include <cmath>
#include <string>

#include "llm/arch/architecture.hpp"
#include "llm/arch/decoder.hpp"
#include "llm/arch/glm4_moe_lite_chat_template.hpp"
#include "llm/arch/glm4_moe_parts.hpp"
#include "llm/arch/layer_shapes.hpp"
#include "llm/arch/mla_attention.hpp"
#include "xmoe/error.hpp"

namespace xmoe::llm {

namespace {

struct Glm4MoeLiteFields final : ArchitectureConfig, LayerShapeFields {
  GlmMoeFields moe;
  MlaDims mla;
  std::optional<MlaDims> mla_dims(const ModelConfig&) const override { return mla; }
  int64_t shared_expert_intermediate(const ModelConfig& c) const override {
    return c.moe_intermediate_size * moe.n_shared_experts;
  }
};

DecoderLayerNames decoder_layer_names(int i) {
  DecoderLayerNames n;
  n.input_norm = glm_layer_prefix(i) + "input_layernorm.weight";
  n.post_norm = glm_layer_prefix(i) + "post_attention_layernorm.weight";
  return n;
}

MlaNames layer_mla_names(int i) {
  return mla_names(glm_layer_prefix(i) + "self_attn.");
}

constexpr const char* kEmbed = "model.embed_tokens.weight";
constexpr const char* kFinalNorm = "model.norm.weight";
constexpr const char* kLmHead = "lm_head.weight";

// One decoder layer's tensors: norms, MLA projections (every one FP8 in a quantized checkpoint, as
// DeepSeek's), the feed-forward side.
void add_layer(std::vector<PlannedTensor>& t, const ModelConfig& c, int i, ExpertLayout layout) {
  const Glm4MoeLiteFields& f = c.arch<Glm4MoeLiteFields>();
  const DecoderLayerNames n = decoder_layer_names(i);
  t.push_back(constant_tensor(n.input_norm, {c.hidden_size}, TensorInit::ones));
  add_mla_tensors(t, layer_mla_names(i), f.mla, c.hidden_size);
  t.push_back(constant_tensor(n.post_norm, {c.hidden_size}, TensorInit::ones));
  add_glm_feed_forward(t, c, f.moe, i, layout);
}

class Glm4MoeLite final : public Architecture {
 public:
  std::string_view name() const override { return "Glm4MoeLiteForCausalLM"; }
  std::string_view model_type() const override { return "glm4_moe_lite"; }

  void parse_config(const FieldReader& r, ModelConfig& c) const override {
    // transformers' Glm4MoeLiteConfig defaults (GLM-4.7-Flash's sizes).
    DecoderDefaults d;
    d.vocab_size = 154880;
    d.hidden_size = 2048;
    d.intermediate_size = 10240;
    d.moe_intermediate_size = 1536;
    d.num_hidden_layers = 47;
    d.num_attention_heads = 20;
    d.num_key_value_heads = 20;
    d.num_experts_per_tok = 4;
    d.rms_norm_eps = 1e-5;
    d.rope_theta = 10000.0;
    d.max_position_embeddings = 202752;
    XMOE_CHECK(!r.has("num_experts"), r.field("num_experts"),
               " is not a Glm4MoeLiteConfig field (GLM counts its routed experts in n_routed_experts)");
    for (const char* key : {"mlp_only_layers", "decoder_sparse_step"})
      XMOE_CHECK(!r.has(key), r.field(key),
                 " is not a Glm4MoeLiteConfig field (mlp_layer_types says which layers are dense)");
    d.num_experts = static_cast<int>(r.get_int("n_routed_experts", 64, 1, kMaxConfigInt));
    parse_decoder_fields(r, d, c);
    if (!r.has("bos_token_id")) c.bos_token_id = 0;
    if (!r.has("eos_token_id")) c.eos_token_ids = {1};

    auto f = std::make_shared<Glm4MoeLiteFields>();
    MlaDims& m = f->mla;
    auto get = [&](const char* key, int def, int lo) {
      return static_cast<int>(r.get_int(key, def, lo, kMaxConfigInt));
    };
    // q_lora_rank: null = no query compression (q_proj); absent = the config class default.
    m.q_lora_rank = parse_q_lora_rank(r, 768);
    m.kv_lora_rank = get("kv_lora_rank", 512, 1);
    m.qk_nope = get("qk_nope_head_dim", 192, 1);
    m.qk_rope = get("qk_rope_head_dim", 64, 2);
    m.v_head = get("v_head_dim", 256, 1);
    m.heads = c.num_attention_heads;
    m.rope_interleave = r.get_bool("rope_interleave", true);
    XMOE_CHECK(m.qk_rope % 2 == 0, r.field("qk_rope_head_dim"), " = ", m.qk_rope,
               " must be even (RoPE rotates pairs)");
    // Glm4MoeLiteConfig maps head_dim onto qk_rope_head_dim: the two may not disagree.
    XMOE_CHECK(!r.has("head_dim") || c.head_dim == m.qk_rope, r.field("head_dim"), " = ", c.head_dim,
               " differs from qk_rope_head_dim = ", m.qk_rope, " (Glm4MoeLiteConfig's alias of it)");
    XMOE_CHECK(c.partial_rotary_factor == 1.0, r.field("partial_rotary_factor"), " = ",
               c.partial_rotary_factor, " is not supported (GLM-4.7-Flash rotates all of qk_rope_head_dim)");
    c.head_dim = c.rotary_dim = m.qk_rope;
    XMOE_CHECK(!c.attention_bias, r.field("attention_bias"),
               " = true is not supported (GLM-4.7-Flash's MLA projections have no biases)");
    XMOE_CHECK(!c.tie_word_embeddings, r.field("tie_word_embeddings"), " = true is not supported");
    m.scale = mla_softmax_scale(r, c, m.qk_head());

    // mlp_layer_types: "dense" / "sparse" per layer; default one dense layer, then MoE.
    std::vector<bool> dense(static_cast<size_t>(c.num_hidden_layers), false);
    dense[0] = true;
    if (r.has("mlp_layer_types")) {
      const nlohmann::json& t = r.at("mlp_layer_types");
      XMOE_CHECK(t.is_array() && t.size() == dense.size(), r.field("mlp_layer_types"),
                 " must be a list of num_hidden_layers = ", c.num_hidden_layers, " strings, got ", t.dump());
      for (size_t i = 0; i < t.size(); ++i) {
        const std::string kind = t[i].is_string() ? t[i].get<std::string>() : t[i].dump();
        XMOE_CHECK(kind == "dense" || kind == "sparse", r.field("mlp_layer_types"), "[", i,
                   "] = ", t[i].dump(), " must be 'dense' or 'sparse'");
        dense[i] = kind == "dense";
      }
    }
    // transformers' Glm4MoeLiteConfig has no first_k_dense_replace (it would be ignored): refuse one that
    // disagrees with the layers mlp_layer_types makes dense rather than run another model than it says.
    if (r.has("first_k_dense_replace")) {
      const int k = get("first_k_dense_replace", 1, 0);
      for (int i = 0; i < c.num_hidden_layers; ++i)
        XMOE_CHECK(dense[static_cast<size_t>(i)] == (i < k), r.field("first_k_dense_replace"), " = ", k,
                   " disagrees with mlp_layer_types at layer ", i,
                   " (Glm4MoeLiteConfig takes the dense layers from mlp_layer_types)");
    }
    for (int i = 0; i < c.num_hidden_layers; ++i)
      if (dense[static_cast<size_t>(i)]) c.mlp_only_layers.push_back(i);
    c.norm_topk_prob = true;
    parse_moe_fields(r, d, c);
    f->moe = parse_glm_moe_fields(r, c, 1.8, 0);
    c.extension = std::move(f);
  }

  std::vector<PlannedTensor> tensors(const ModelConfig& c, ExpertLayout layout) const override {
    std::vector<PlannedTensor> t;
    t.push_back(random_tensor(kEmbed, {c.vocab_size, c.hidden_size}));
    for (int i = 0; i < c.num_hidden_layers; ++i) add_layer(t, c, i, layout);
    const int mtp = c.arch<Glm4MoeLiteFields>().moe.num_nextn_predict_layers;
    for (int i = c.num_hidden_layers; i < c.num_hidden_layers + mtp; ++i) {
      add_layer(t, c, i, layout);
      add_glm_mtp_extras(t, c, i);
    }
    t.push_back(constant_tensor(kFinalNorm, {c.hidden_size}, TensorInit::ones));
    t.push_back(random_tensor(kLmHead, {c.vocab_size, c.hidden_size}, TensorRole::kept_linear));
    return t;
  }

  std::unique_ptr<CausalLM> load(const Checkpoint& checkpoint, const LoadOptions& options) const override {
    const ModelConfig& c = checkpoint.config();
    const Glm4MoeLiteFields& f = c.arch<Glm4MoeLiteFields>();
    DecoderSpec spec;
    spec.embed = kEmbed;
    spec.final_norm = kFinalNorm;
    spec.lm_head = kLmHead;
    spec.layer_names = &decoder_layer_names;
    spec.kv_latent_width = f.mla.latent_width();
    spec.attention_layer = [dims = f.mla, H = c.hidden_size](
                               int i, DecoderLoader& ld) -> std::unique_ptr<AttentionLayer> {
      return std::make_unique<MlaAttention>(dims, load_mla_weights(ld, layer_mla_names(i), dims, H));
    };
    // Only layers [0, num_hidden_layers) are loaded: the MTP layers after them are skipped.
    spec.feed_forward = [c, moe = f.moe](int i, DecoderLoader& loader) {
      return load_glm_feed_forward(loader, c, moe, i);
    };
    return load_decoder(checkpoint, options, std::move(spec));
  }

  // GLM-4.7-Flash's added tokens are GLM-4.5's, with its own chat template.
  InitModelSpec init_model_spec(const ModelConfig&) const override {
    return glm_init_model_spec(kGlm4MoeLiteChatTemplate);
  }
};

}  // namespace

const Architecture& glm4_moe_lite_architecture() {
  static const Glm4MoeLite arch;
  return arch;
}

}  // namespace xmoe::llm
