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
#include "llm/arch/feed_forward.hpp"
#include "llm/arch/glm4_moe_chat_template.hpp"
#include "xmoe/error.hpp"

namespace xmoe::llm {

namespace {

// config.json fields only GLM-4.5+ (of the architectures here) has.
struct Glm4MoeFields final : ArchitectureConfig {
  int first_k_dense_replace = 1;
  int n_shared_experts = 1;
  int n_group = 1, topk_group = 1;
  double routed_scaling_factor = 1.0;
  bool use_qk_norm = false;
  int num_nextn_predict_layers = 1;
};

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
  static MoeNames moe(int i, const ModelConfig& c) {
    const std::string p = layer(i) + "mlp.";
    MoeNames n;
    n.router = p + "gate.weight";
    n.correction_bias = p + "gate.e_score_correction_bias";
    n.expert = [p](int e, const char* proj) {
      return p + "experts." + std::to_string(e) + "." + proj + ".weight";
    };
    n.fused_gate_up = p + "experts.gate_up_proj";
    n.fused_down = p + "experts.down_proj";
    n.shared = {p + "shared_experts.gate_proj.weight", p + "shared_experts.up_proj.weight",
                p + "shared_experts.down_proj.weight"};
    n.shared_intermediate = c.moe_intermediate_size * c.arch<Glm4MoeFields>().n_shared_experts;
    return n;
  }
  static DenseMlpNames dense(int i) {
    const std::string p = layer(i) + "mlp.";
    return {p + "gate_proj.weight", p + "up_proj.weight", p + "down_proj.weight"};
  }
  // A multi-token-prediction layer's own tensors (besides a decoder layer's), as DeepSeek-V3 / GLM store
  // them.
  struct Mtp {
    std::string embed, enorm, hnorm, eh_proj, head_norm, head;
  };
  static Mtp mtp(int i) {
    const std::string p = layer(i);
    return {
        p + "embed_tokens.weight",     p + "enorm.weight",           p + "hnorm.weight", p + "eh_proj.weight",
        p + "shared_head.norm.weight", p + "shared_head.head.weight"};
  }
  static constexpr const char* kEmbed = "model.embed_tokens.weight";
  static constexpr const char* kFinalNorm = "model.norm.weight";
  static constexpr const char* kLmHead = "lm_head.weight";
};

constexpr TensorRole kQuant = TensorRole::quantized_linear;

void add_pair(std::vector<PlannedTensor>& t, const std::string& gate, const std::string& up, int64_t rows,
              int64_t cols) {
  t.push_back(random_tensor(gate, {rows, cols}, kQuant));
  t.back().scale_partner = up;
  t.push_back(random_tensor(up, {rows, cols}, kQuant));
  t.back().scale_partner = gate;
}

void add_dense_mlp(std::vector<PlannedTensor>& t, const DenseMlpNames& m, int64_t hidden, int64_t inter) {
  add_pair(t, m.gate, m.up, inter, hidden);
  t.push_back(random_tensor(m.down, {hidden, inter}, kQuant));
}

// One decoder layer's tensors in module order (input norm, attention, post norm, MLP or MoE block).
void add_layer(std::vector<PlannedTensor>& t, const ModelConfig& c, int i, ExpertLayout layout) {
  const Glm4MoeFields& f = c.arch<Glm4MoeFields>();
  const int64_t H = c.hidden_size, D = c.head_dim, E = c.num_experts, I = c.moe_intermediate_size;
  const int64_t q_dim = int64_t{c.num_attention_heads} * D, kv_dim = int64_t{c.num_key_value_heads} * D;
  const DecoderLayerNames n = Names::decoder_layer(i);
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
  if (!c.is_sparse_layer(i)) {
    add_dense_mlp(t, Names::dense(i), H, c.intermediate_size);
    return;
  }
  const MoeNames m = Names::moe(i, c);
  if (layout == ExpertLayout::per_expert) {
    for (int j = 0; j < E; ++j) {
      add_pair(t, m.expert(j, "gate_proj"), m.expert(j, "up_proj"), I, H);
      t.push_back(random_tensor(m.expert(j, "down_proj"), {H, I}, kQuant));
    }
  } else {
    // A fused tensor is its per-expert tensors' random streams one after the other.
    PlannedTensor gate_up{m.fused_gate_up, {E, 2 * I, H}, TensorInit::normal, {}, TensorRole::other, ""};
    PlannedTensor down{m.fused_down, {E, H, I}, TensorInit::normal, {}, TensorRole::other, ""};
    const int64_t per_expert = H * I;
    for (int j = 0; j < E; ++j) {
      gate_up.segments.push_back({m.expert(j, "gate_proj"), per_expert});
      gate_up.segments.push_back({m.expert(j, "up_proj"), per_expert});
      down.segments.push_back({m.expert(j, "down_proj"), per_expert});
    }
    t.push_back(std::move(gate_up));
    t.push_back(std::move(down));
  }
  // GLM's published FP8 checkpoints keep the router (mlp.gate) unquantized; transformers initialises the
  // correction bias to zeros.
  t.push_back(random_tensor(m.router, {E, H}, TensorRole::kept_linear));
  t.push_back(constant_tensor(m.correction_bias, {E}, TensorInit::zeros));
  if (m.shared_intermediate > 0) add_dense_mlp(t, m.shared, H, m.shared_intermediate);
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
    f->first_k_dense_replace = static_cast<int>(r.get_int("first_k_dense_replace", 1, 0, kMaxConfigInt));
    for (int i = 0; i < std::min(f->first_k_dense_replace, c.num_hidden_layers); ++i)
      c.mlp_only_layers.push_back(i);
    parse_moe_fields(r, d, c);
    f->n_shared_experts = static_cast<int>(r.get_int("n_shared_experts", 1, 0, kMaxConfigInt));
    f->n_group = static_cast<int>(r.get_int("n_group", 1, 1, kMaxConfigInt));
    f->topk_group = static_cast<int>(r.get_int("topk_group", 1, 1, kMaxConfigInt));
    f->routed_scaling_factor = r.get_positive("routed_scaling_factor", 1.0);
    f->use_qk_norm = r.get_bool("use_qk_norm", false);
    const char* mtp_key = r.has("num_mtp_layers") ? "num_mtp_layers" : "num_nextn_predict_layers";
    f->num_nextn_predict_layers = static_cast<int>(r.get_int(mtp_key, 1, 0, 1 << 10));

    const int E = c.num_experts;
    XMOE_CHECK(E % f->n_group == 0, r.field("n_group"), " = ", f->n_group,
               " must divide n_routed_experts = ", E);
    XMOE_CHECK(f->n_group == 1 || E / f->n_group >= 2, r.field("n_group"), " = ", f->n_group,
               " leaves groups of one expert (a group's score is the sum of its two best experts)");
    XMOE_CHECK(f->topk_group <= f->n_group, r.field("topk_group"), " = ", f->topk_group,
               " exceeds n_group = ", f->n_group);
    XMOE_CHECK(c.num_experts_per_tok <= f->topk_group * (E / f->n_group), r.field("num_experts_per_tok"),
               " = ", c.num_experts_per_tok, " exceeds the experts of topk_group groups (", f->topk_group,
               " x ", E / f->n_group, ")");
    const std::string act = r.opt_string("hidden_act").value_or("silu");
    XMOE_CHECK(act == "silu", r.field("hidden_act"), " = '", act, "' is not supported (only 'silu')");
    XMOE_CHECK(!r.has("layer_types") && !r.has("sliding_window"),
               r.field(r.has("layer_types") ? "layer_types" : "sliding_window"),
               " is not supported (GLM-4.5+ attends over the whole context in every layer)");
    c.extension = std::move(f);
  }

  std::vector<PlannedTensor> tensors(const ModelConfig& c, ExpertLayout layout) const override {
    const int64_t H = c.hidden_size, V = c.vocab_size;
    std::vector<PlannedTensor> t;
    t.push_back(random_tensor(Names::kEmbed, {V, H}));
    for (int i = 0; i < c.num_hidden_layers; ++i) add_layer(t, c, i, layout);
    // The MTP layers as GLM publishes them (after the decoder layers in its checkpoints' module order):
    // the decoder layer, then embeddings, the two input norms, the projection of [enorm(e); hnorm(h)], and
    // the shared head. Their projections stay unquantized like the router and lm_head.
    const int mtp = c.arch<Glm4MoeFields>().num_nextn_predict_layers;
    for (int i = c.num_hidden_layers; i < c.num_hidden_layers + mtp; ++i) {
      add_layer(t, c, i, layout);
      const Names::Mtp m = Names::mtp(i);
      t.push_back(random_tensor(m.embed, {V, H}));
      t.push_back(constant_tensor(m.enorm, {H}, TensorInit::ones));
      t.push_back(constant_tensor(m.hnorm, {H}, TensorInit::ones));
      t.push_back(random_tensor(m.eh_proj, {H, 2 * H}, TensorRole::kept_linear));
      t.push_back(constant_tensor(m.head_norm, {H}, TensorInit::ones));
      t.push_back(random_tensor(m.head, {V, H}, TensorRole::kept_linear));
    }
    t.push_back(constant_tensor(Names::kFinalNorm, {H}, TensorInit::ones));
    if (!c.tie_word_embeddings) t.push_back(random_tensor(Names::kLmHead, {V, H}, TensorRole::kept_linear));
    return t;
  }

  std::unique_ptr<CausalLM> load(const Checkpoint& checkpoint, const LoadOptions& options) const override {
    const ModelConfig& c = checkpoint.config();
    const Glm4MoeFields& f = c.arch<Glm4MoeFields>();
    DecoderSpec spec;
    spec.embed = Names::kEmbed;
    spec.final_norm = Names::kFinalNorm;
    spec.lm_head = Names::kLmHead;
    spec.attention.qk_norm = f.use_qk_norm;
    spec.attention.qkv_bias = c.attention_bias;  // Glm4MoeAttention's o_proj has no bias
    spec.layer_names = &Names::decoder_layer;
    LlmRouterConfig router;
    router.type = LlmRouterType::deepseek_v3;
    router.num_experts = c.num_experts;
    router.top_k = c.num_experts_per_tok;
    router.norm_topk_prob = c.norm_topk_prob;
    router.n_group = f.n_group;
    router.topk_group = f.topk_group;
    router.routed_scaling_factor = f.routed_scaling_factor;
    // Only layers [0, num_hidden_layers) are loaded: the MTP layers after them are skipped.
    spec.feed_forward = [router, c](int i, DecoderLoader& loader) -> std::unique_ptr<FeedForward> {
      if (c.is_sparse_layer(i))
        return load_swiglu_moe(loader, Names::moe(i, c), router, c.hidden_size, c.moe_intermediate_size, i);
      return load_dense_swiglu(loader, Names::dense(i), c.hidden_size, c.intermediate_size);
    };
    return load_decoder(checkpoint, options, std::move(spec));
  }

  InitModelSpec init_model_spec() const override {
    InitModelSpec s;
    // GLM-4.5/4.6's added tokens in id order (151329 ...). The role and control tokens are special; the
    // thinking, tool-call and box tags are added but not special, so they stay in decoded text for the
    // output parsers.
    s.special_tokens = {{"<|endoftext|>", true},
                        {"[MASK]", true},
                        {"[gMASK]", true},
                        {"[sMASK]", true},
                        {"<sop>", true},
                        {"<eop>", true},
                        {"<|system|>", true},
                        {"<|user|>", true},
                        {"<|assistant|>", true},
                        {"<|observation|>", true},
                        {"<|begin_of_image|>", true},
                        {"<|end_of_image|>", true},
                        {"<|begin_of_video|>", true},
                        {"<|end_of_video|>", true},
                        {"<|begin_of_audio|>", true},
                        {"<|end_of_audio|>", true},
                        {"<|begin_of_transcription|>", true},
                        {"<|end_of_transcription|>", true},
                        {"<|code_prefix|>", true},
                        {"<|code_middle|>", true},
                        {"<|code_suffix|>", true},
                        {"<think>", false},
                        {"</think>", false},
                        {"<tool_call>", false},
                        {"</tool_call>", false},
                        {"<tool_response>", false},
                        {"</tool_response>", false},
                        {"<arg_key>", false},
                        {"</arg_key>", false},
                        {"<arg_value>", false},
                        {"</arg_value>", false},
                        {"/nothink", false},
                        {"<|begin_of_box|>", false},
                        {"<|end_of_box|>", false},
                        {"<|image|>", true},
                        {"<|video|>", true}};
    // GLM-4's pre-tokenizer split (its tiktoken pat_str: digits in runs of up to three).
    s.split_regex =
        R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
    s.chat_template = std::string(kGlm4MoeChatTemplate);
    s.tokenizer_class = "PreTrainedTokenizerFast";
    s.eos_token = "<|endoftext|>";
    s.pad_token = "<|endoftext|>";
    s.additional_special_tokens = {"<|endoftext|>", "[MASK]",         "[gMASK]",    "[sMASK]",
                                   "<sop>",         "<eop>",          "<|system|>", "<|user|>",
                                   "<|assistant|>", "<|observation|>"};
    s.model_max_length = 202752;
    s.config_eos = "<|endoftext|>";
    // GLM-4.6's generation_config: a turn ends at <|endoftext|>, or where the next <|user|> / tool
    // <|observation|> would start.
    s.generation_eos = {"<|endoftext|>", "<|user|>", "<|observation|>"};
    s.generation_pad = "<|endoftext|>";
    s.sampling["do_sample"] = true;
    s.sampling["temperature"] = 1.0;
    s.sampling["top_p"] = 0.95;
    s.initializer_range = 0.02;
    return s;
  }
};

}  // namespace

const Architecture& glm4_moe_architecture() {
  static const Glm4Moe arch;
  return arch;
}

}  // namespace xmoe::llm
