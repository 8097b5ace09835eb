// Qwen3MoeForCausalLM (transformers models/qwen3_moe/modeling_qwen3_moe.py): token embeddings; per layer
// RMSNorm → GQA attention (q/k RMSNorm per head before RoPE) → residual → RMSNorm → MoE block (softmax top-k
// router, optional renormalisation, SwiGLU experts) or dense SwiGLU MLP → residual; final RMSNorm; lm_head
// (tied to the embeddings or not). Everything Qwen3-MoE-specific lives here: its config, its tensor names
// (read by the loader and written by init-model), its decoder spec and its init-model tokenizer and chat
// template.
#include <string>

#include "llm/arch/architecture.hpp"
#include "llm/arch/decoder.hpp"
#include "llm/arch/feed_forward.hpp"
#include "llm/arch/qwen3_moe_chat_template.hpp"
#include "xmoe/error.hpp"

namespace xmoe::llm {

namespace {

// The tensor-name map: one place for the names the loader reads and init-model / quantize write.
struct Names {
  static std::string layer(int i) { return "model.layers." + std::to_string(i) + "."; }
  static DecoderLayerNames decoder_layer(int i) {
    const std::string p = layer(i);
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
  static MoeNames moe(int i) {
    const std::string p = layer(i) + "mlp.";
    MoeNames n;
    n.router = p + "gate.weight";
    n.expert = [p](int e, const char* proj) {
      return p + "experts." + std::to_string(e) + "." + proj + ".weight";
    };
    n.fused_gate_up = p + "experts.gate_up_proj";
    n.fused_down = p + "experts.down_proj";
    return n;
  }
  static DenseMlpNames dense(int i) {
    const std::string p = layer(i) + "mlp.";
    return {p + "gate_proj.weight", p + "up_proj.weight", p + "down_proj.weight"};
  }
  static constexpr const char* kEmbed = "model.embed_tokens.weight";
  static constexpr const char* kFinalNorm = "model.norm.weight";
  static constexpr const char* kLmHead = "lm_head.weight";
};

class Qwen3Moe final : public Architecture {
 public:
  std::string_view name() const override { return "Qwen3MoeForCausalLM"; }
  std::string_view model_type() const override { return "qwen3_moe"; }

  void parse_config(const FieldReader& r, ModelConfig& c) const override {
    // transformers' Qwen3MoeConfig (v5) defaults.
    DecoderDefaults d;
    d.vocab_size = 151936;
    d.hidden_size = 2048;
    d.intermediate_size = 6144;
    d.moe_intermediate_size = 768;
    d.num_hidden_layers = 24;
    d.num_attention_heads = 32;
    d.num_key_value_heads = 4;
    d.num_experts = 128;
    d.num_experts_per_tok = 8;
    d.rms_norm_eps = 1e-6;
    d.max_position_embeddings = 32768;
    parse_decoder_fields(r, d, c);
    parse_moe_fields(r, d, c);

    // What Qwen3-MoE's modeling code does not do (or xmoe's Qwen3-MoE does not).
    XMOE_CHECK(c.rotary_dim == c.head_dim, r.field("partial_rotary_factor"), " = ", c.partial_rotary_factor,
               " is not supported (Qwen3-MoE rotates the whole head)");
    if (c.rope_scaling)
      XMOE_CHECK(c.rope_scaling->truncate, r.where(), ": field '", c.rope_scaling->source,
                 ".truncate' = false is not supported by Qwen3MoeForCausalLM");
    const std::string act = r.opt_string("hidden_act").value_or("silu");
    XMOE_CHECK(act == "silu", r.field("hidden_act"), " = '", act, "' is not supported (only 'silu')");
    XMOE_CHECK(!r.get_bool("use_sliding_window", false), r.field("use_sliding_window"),
               " = true is not supported (sliding-window attention)");
  }

  std::vector<PlannedTensor> tensors(const ModelConfig& c, ExpertLayout layout) const override {
    const int64_t H = c.hidden_size, D = c.head_dim, E = c.num_experts, I = c.moe_intermediate_size;
    const int64_t q_dim = int64_t{c.num_attention_heads} * D, kv_dim = int64_t{c.num_key_value_heads} * D;
    constexpr TensorRole kQuant = TensorRole::quantized_linear;
    std::vector<PlannedTensor> t;
    t.push_back(random_tensor(Names::kEmbed, {c.vocab_size, H}));
    for (int i = 0; i < c.num_hidden_layers; ++i) {
      const DecoderLayerNames n = Names::decoder_layer(i);
      t.push_back(constant_tensor(n.input_norm, {H}, TensorInit::ones));
      t.push_back(random_tensor(n.attention.q + ".weight", {q_dim, H}, kQuant));
      t.push_back(random_tensor(n.attention.k + ".weight", {kv_dim, H}, kQuant));
      t.push_back(random_tensor(n.attention.v + ".weight", {kv_dim, H}, kQuant));
      t.push_back(random_tensor(n.attention.o + ".weight", {H, q_dim}, kQuant));
      if (c.attention_bias) {
        // transformers initialises Linear biases to zero.
        t.push_back(constant_tensor(n.attention.q + ".bias", {q_dim}, TensorInit::zeros));
        t.push_back(constant_tensor(n.attention.k + ".bias", {kv_dim}, TensorInit::zeros));
        t.push_back(constant_tensor(n.attention.v + ".bias", {kv_dim}, TensorInit::zeros));
        t.push_back(constant_tensor(n.attention.o + ".bias", {H}, TensorInit::zeros));
      }
      t.push_back(constant_tensor(n.attention.q_norm, {D}, TensorInit::ones));
      t.push_back(constant_tensor(n.attention.k_norm, {D}, TensorInit::ones));
      t.push_back(constant_tensor(n.post_norm, {H}, TensorInit::ones));
      if (c.is_sparse_layer(i)) {
        const MoeNames m = Names::moe(i);
        t.push_back(random_tensor(m.router, {E, H}, TensorRole::kept_linear));
        if (layout == ExpertLayout::per_expert) {
          for (int j = 0; j < E; ++j) {
            t.push_back(random_tensor(m.expert(j, "gate_proj"), {I, H}, kQuant));
            t.back().scale_partner = m.expert(j, "up_proj");
            t.push_back(random_tensor(m.expert(j, "up_proj"), {I, H}, kQuant));
            t.back().scale_partner = m.expert(j, "gate_proj");
            t.push_back(random_tensor(m.expert(j, "down_proj"), {H, I}, kQuant));
          }
        } else {
          // A fused tensor is its per-expert tensors' random streams one after the other.
          PlannedTensor gate_up{
              m.fused_gate_up, {E, 2 * I, H}, TensorInit::normal, {}, TensorRole::other, ""};
          PlannedTensor down{m.fused_down, {E, H, I}, TensorInit::normal, {}, TensorRole::other, ""};
          const int64_t per_expert = random_tensor(m.expert(0, "down_proj"), {H, I}).numel();
          for (int j = 0; j < E; ++j) {
            gate_up.segments.push_back({m.expert(j, "gate_proj"), per_expert});
            gate_up.segments.push_back({m.expert(j, "up_proj"), per_expert});
            down.segments.push_back({m.expert(j, "down_proj"), per_expert});
          }
          t.push_back(std::move(gate_up));
          t.push_back(std::move(down));
        }
      } else {
        const DenseMlpNames m = Names::dense(i);
        const int64_t F = c.intermediate_size;
        t.push_back(random_tensor(m.gate, {F, H}, kQuant));
        t.back().scale_partner = m.up;
        t.push_back(random_tensor(m.up, {F, H}, kQuant));
        t.back().scale_partner = m.gate;
        t.push_back(random_tensor(m.down, {H, F}, kQuant));
      }
    }
    t.push_back(constant_tensor(Names::kFinalNorm, {H}, TensorInit::ones));
    if (!c.tie_word_embeddings)
      t.push_back(random_tensor(Names::kLmHead, {c.vocab_size, H}, TensorRole::kept_linear));
    return t;
  }

  std::unique_ptr<CausalLM> load(const Checkpoint& checkpoint, const LoadOptions& options) const override {
    const ModelConfig& c = checkpoint.config();
    DecoderSpec spec;
    spec.embed = Names::kEmbed;
    spec.final_norm = Names::kFinalNorm;
    spec.lm_head = Names::kLmHead;
    spec.attention.qk_norm = true;
    spec.attention.qkv_bias = spec.attention.o_bias = c.attention_bias;
    spec.layer_names = &Names::decoder_layer;
    LlmRouterConfig router;
    router.type = LlmRouterType::qwen3;
    router.num_experts = c.num_experts;
    router.top_k = c.num_experts_per_tok;
    router.norm_topk_prob = c.norm_topk_prob;
    spec.feed_forward = [router, c](int i, DecoderLoader& loader) -> std::unique_ptr<FeedForward> {
      if (c.is_sparse_layer(i))
        return load_swiglu_moe(loader, Names::moe(i), router, c.hidden_size, c.moe_intermediate_size, i);
      return load_dense_swiglu(loader, Names::dense(i), c.hidden_size, c.intermediate_size);
    };
    return load_decoder(checkpoint, options, std::move(spec));
  }

  InitModelSpec init_model_spec(const ModelConfig&) const override {
    InitModelSpec s;
    // As Qwen3 marks them: the think/tool tags are added tokens but not "special".
    s.special_tokens = {{"<|endoftext|>", true}, {"<|im_start|>", true}, {"<|im_end|>", true},
                        {"<think>", false},      {"</think>", false},    {"<tool_call>", false},
                        {"</tool_call>", false}};
    // Qwen2/Qwen3's pre-tokenizer split (tokenizer.json of Qwen/Qwen3-*).
    s.split_regex =
        R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
    s.chat_template = kQwen3ChatTemplate;
    s.tokenizer_class = "Qwen2Tokenizer";
    s.eos_token = "<|im_end|>";
    s.pad_token = "<|endoftext|>";
    s.additional_special_tokens = {"<|im_start|>", "<|im_end|>"};
    s.model_max_length = 131072;
    s.config_bos = "<|endoftext|>";
    s.config_eos = "<|im_end|>";
    s.generation_eos = {"<|im_end|>", "<|endoftext|>"};
    s.generation_pad = "<|endoftext|>";
    // Qwen3's published sampling defaults.
    s.sampling["do_sample"] = true;
    s.sampling["temperature"] = 0.6;
    s.sampling["top_k"] = 20;
    s.sampling["top_p"] = 0.95;
    s.initializer_range = 0.02;
    return s;
  }
};

}  // namespace

const Architecture& qwen3_moe_architecture() {
  static const Qwen3Moe arch;
  return arch;
}

}  // namespace xmoe::llm
