// DeepseekV3ForCausalLM (transformers models/deepseek_v3/modeling_deepseek_v3.py): DeepSeek-V3, R1, V3.1, and
// Kimi-K2 (the same class with model_type kimi_k2). Per layer RMSNorm → multi-head latent attention (MLA,
// llm/arch/mla_attention.hpp, a latent KV cache of kv_lora_rank + qk_rope_head_dim values per token) →
// residual → RMSNorm → dense SwiGLU (the first first_k_dense_replace layers) or the MoE block (sigmoid router
// with e_score_correction_bias for selection, n_group / topk_group group-limited choice, norm_topk_prob,
// routed_scaling_factor; n_shared_experts shared experts added) → residual. The MTP layers
// (num_nextn_predict_layers, tensors model.layers.<num_hidden_layers + i>.*) are not run and not read.
#include <cmath>
#include <string>

#include "llm/arch/architecture.hpp"
#include "llm/arch/decoder.hpp"
#include "llm/arch/deepseek_v3_chat_template.hpp"
#include "llm/arch/feed_forward.hpp"
#include "llm/arch/kimi_k2_chat_template.hpp"
#include "llm/arch/layer_shapes.hpp"
#include "llm/arch/mla_attention.hpp"
#include "xmoe/error.hpp"

namespace xmoe::llm {

namespace {

MlaDims mla_dims(const ModelConfig& c);

struct DeepseekV3Fields final : ArchitectureConfig, LayerShapeFields {
  std::optional<MlaDims> mla_dims(const ModelConfig& c) const override { return llm::mla_dims(c); }
  int64_t shared_expert_intermediate(const ModelConfig& c) const override {
    return c.moe_intermediate_size * n_shared_experts;
  }
  int q_lora_rank = 1536;  // 0: null (q_proj)
  int kv_lora_rank = 512, qk_nope_head_dim = 128, qk_rope_head_dim = 64, v_head_dim = 128;
  int n_shared_experts = 1, n_group = 8, topk_group = 4;
  int first_k_dense_replace = 3, moe_layer_freq = 1, num_nextn_predict_layers = 0;
  double routed_scaling_factor = 2.5;
  bool rope_interleave = true;
  float softmax_scale = 0;  // qk_head_dim^-0.5, times mscale² under YaRN with mscale_all_dim
  // DeepSeek-V3.2's lightning indexer (0 = none): it picks index_topk positions per query, so up to
  // index_topk positions dense MLA is exactly what it computes.
  int index_topk = 0, index_head_dim = 0, index_n_heads = 0;
};

struct Names {
  static std::string layer(int i) { return "model.layers." + std::to_string(i) + "."; }
  static DecoderLayerNames decoder_layer(int i) {
    DecoderLayerNames n;
    n.input_norm = layer(i) + "input_layernorm.weight";
    n.post_norm = layer(i) + "post_attention_layernorm.weight";
    return n;
  }
  static MlaNames mla(int i) { return mla_names(layer(i) + "self_attn."); }
  // DeepSeek-V3.2's indexer: wq_b [n_heads·head_dim, q_lora], wk [head_dim, H], LayerNorm k_norm (weight,
  // bias), weights_proj [n_heads, H].
  struct Indexer {
    std::string wq_b, wk, k_norm, k_norm_bias, weights_proj;
  };
  static Indexer indexer(int i) {
    const std::string p = layer(i) + "self_attn.indexer.";
    return {p + "wq_b.weight", p + "wk.weight", p + "k_norm.weight", p + "k_norm.bias",
            p + "weights_proj.weight"};
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
    n.shared_intermediate = c.moe_intermediate_size * c.arch<DeepseekV3Fields>().n_shared_experts;
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

MlaDims mla_dims(const ModelConfig& c) {
  const DeepseekV3Fields& f = c.arch<DeepseekV3Fields>();
  MlaDims d;
  d.heads = c.num_attention_heads;
  d.q_lora_rank = f.q_lora_rank;
  d.kv_lora_rank = f.kv_lora_rank;
  d.qk_nope = f.qk_nope_head_dim;
  d.qk_rope = f.qk_rope_head_dim;
  d.v_head = f.v_head_dim;
  d.scale = f.softmax_scale;
  d.rope_interleave = f.rope_interleave;
  d.max_context = f.index_topk;
  return d;
}

// Kimi-K2 (model_type kimi_k2): a tiktoken vocabulary (tiktoken.model, Kimi's pattern) with its special
// tokens in the reserved ids after the ranks, in Kimi-K2-Instruct's order, and Kimi-K2-Instruct's template.
InitModelSpec kimi_k2_init_model_spec() {
  InitModelSpec s;
  for (const char* t : {"[BOS]",
                        "[EOS]",
                        "<|im_end|>",
                        "<|im_user|>",
                        "<|im_assistant|>",
                        "<|start_header_id|>",
                        "<|end_header_id|>",
                        "[EOT]",
                        "<|im_system|>",
                        "<|tool_calls_section_begin|>",
                        "<|tool_calls_section_end|>",
                        "<|tool_call_begin|>",
                        "<|tool_call_argument_begin|>",
                        "<|tool_call_end|>",
                        "<|im_middle|>",
                        "<|media_start|>",
                        "<|media_content|>",
                        "<|media_end|>",
                        "<|media_pad|>",
                        "[UNK]",
                        "[PAD]"})
    s.special_tokens.push_back({t, true});
  s.tiktoken_vocabulary = true;
  s.chat_template = kKimiK2ChatTemplate;
  s.tokenizer_class = "TikTokenTokenizer";
  s.bos_token = "[BOS]";
  s.eos_token = "[EOS]";
  s.pad_token = "[PAD]";
  s.additional_special_tokens = {"<|im_end|>",          "<|im_user|>",       "<|im_assistant|>",
                                 "<|start_header_id|>", "<|end_header_id|>", "[EOT]",
                                 "<|im_system|>",       "<|im_middle|>"};
  s.model_max_length = 131072;
  s.config_bos = "[BOS]";
  s.config_eos = "[EOS]";
  s.generation_eos = {"<|im_end|>"};
  s.generation_pad = "[PAD]";
  s.sampling["do_sample"] = true;
  s.sampling["temperature"] = 0.6;
  s.initializer_range = 0.02;
  return s;
}

// DeepseekV3ForCausalLM (deepseek_v3, kimi_k2), or with v32 DeepseekV32ForCausalLM (deepseek_v32: the same
// MLA and MoE plus the lightning indexer's tensors; contexts up to index_topk only, where dense MLA is
// exact).
class DeepseekV3 final : public Architecture {
 public:
  explicit DeepseekV3(bool v32) : v32_(v32) {}
  std::string_view name() const override { return v32_ ? "DeepseekV32ForCausalLM" : "DeepseekV3ForCausalLM"; }
  std::string_view model_type() const override { return v32_ ? "deepseek_v32" : "deepseek_v3"; }
  bool has_model_type(std::string_view t) const override {
    return t == model_type() || (!v32_ && t == "kimi_k2");
  }

  void parse_config(const FieldReader& r, ModelConfig& c) const override {
    // transformers' DeepseekV3Config defaults.
    DecoderDefaults d;
    d.vocab_size = 129280;
    d.hidden_size = 7168;
    d.intermediate_size = 18432;
    d.moe_intermediate_size = 2048;
    d.num_hidden_layers = 61;
    d.num_attention_heads = 128;
    d.num_key_value_heads = 128;
    d.num_experts_per_tok = 8;
    d.rms_norm_eps = 1e-6;
    d.max_position_embeddings = 4096;
    d.num_experts = static_cast<int>(r.get_int("n_routed_experts", 256, 1, kMaxConfigInt));
    parse_decoder_fields(r, d, c);
    auto f = std::make_shared<DeepseekV3Fields>();
    auto get = [&](const char* key, int def, int lo) {
      return static_cast<int>(r.get_int(key, def, lo, kMaxConfigInt));
    };
    f->q_lora_rank = parse_q_lora_rank(r, 1536);
    f->kv_lora_rank = get("kv_lora_rank", 512, 1);
    f->qk_nope_head_dim = get("qk_nope_head_dim", 128, 1);
    f->qk_rope_head_dim = get("qk_rope_head_dim", 64, 2);
    f->v_head_dim = get("v_head_dim", 128, 1);
    f->n_shared_experts = get("n_shared_experts", 1, 0);
    f->n_group = get("n_group", 8, 1);
    f->topk_group = get("topk_group", 4, 1);
    f->first_k_dense_replace = get("first_k_dense_replace", 3, 0);
    f->moe_layer_freq = get("moe_layer_freq", 1, 1);
    f->num_nextn_predict_layers =
        get(r.has("num_mtp_layers") ? "num_mtp_layers" : "num_nextn_predict_layers", 0, 0);
    f->routed_scaling_factor = r.get_positive("routed_scaling_factor", 2.5);
    // V3.2's attention always rotates interleaved pairs (transformers' DeepseekV32Attention).
    f->rope_interleave = v32_ || r.get_bool("rope_interleave", true);
    if (v32_) {
      f->index_topk = get("index_topk", 2048, 1);
      f->index_head_dim = get("index_head_dim", 128, 1);
      f->index_n_heads = get("index_n_heads", 64, 1);
      XMOE_CHECK(f->q_lora_rank > 0, r.field("q_lora_rank"),
                 " must be set for DeepseekV32ForCausalLM (its indexer reads the compressed query)");
      XMOE_CHECK(f->index_head_dim >= f->qk_rope_head_dim, r.field("index_head_dim"), " = ",
                 f->index_head_dim, " must be >= qk_rope_head_dim = ", f->qk_rope_head_dim);
    }
    XMOE_CHECK(f->qk_rope_head_dim % 2 == 0, r.field("qk_rope_head_dim"), " = ", f->qk_rope_head_dim,
               " must be even (RoPE rotates pairs)");
    // transformers: head_dim = qk_rope_head_dim (what RoPE rotates); the whole of it rotates.
    c.head_dim = c.rotary_dim = f->qk_rope_head_dim;
    XMOE_CHECK(c.partial_rotary_factor == 1.0, r.field("partial_rotary_factor"), " = ",
               c.partial_rotary_factor, " is not supported (DeepSeek-V3 rotates all of qk_rope_head_dim)");
    // Dense layers: the first first_k_dense_replace, and those moe_layer_freq skips (DeepSeek's modeling
    // code).
    if (v32_ && r.has("mlp_layer_types")) {
      // V3.2: "dense" / "sparse" per layer.
      const nlohmann::json& m = r.at("mlp_layer_types");
      XMOE_CHECK(m.is_array() && m.size() == static_cast<size_t>(c.num_hidden_layers),
                 r.field("mlp_layer_types"), " must list one of \"dense\" / \"sparse\" per layer (",
                 c.num_hidden_layers, "), got ", m.dump());
      for (int i = 0; i < c.num_hidden_layers; ++i) {
        const nlohmann::json& v = m[static_cast<size_t>(i)];
        XMOE_CHECK(v == "dense" || v == "sparse", r.field("mlp_layer_types"), "[", i, "] = ", v.dump(),
                   " is not \"dense\" or \"sparse\"");
        if (v == "dense") c.mlp_only_layers.push_back(i);
      }
    } else {
      for (int i = 0; i < c.num_hidden_layers; ++i)
        if (i < f->first_k_dense_replace || i % f->moe_layer_freq != 0) c.mlp_only_layers.push_back(i);
    }
    c.norm_topk_prob = true;  // DeepseekV3Config's default
    parse_moe_fields(r, d, c);

    f->softmax_scale = mla_softmax_scale(r, c, f->qk_nope_head_dim + f->qk_rope_head_dim);

    const bool kimi = c.model_type == "kimi_k2";
    if (c.num_experts > 0) {
      XMOE_CHECK(c.num_experts % f->n_group == 0, r.field("n_group"), " = ", f->n_group,
                 " must divide n_routed_experts = ", c.num_experts);
      XMOE_CHECK(f->topk_group <= f->n_group, r.field("topk_group"), " = ", f->topk_group,
                 " exceeds n_group = ", f->n_group);
      XMOE_CHECK(c.num_experts_per_tok <= f->topk_group * (c.num_experts / f->n_group),
                 r.field("num_experts_per_tok"), " = ", c.num_experts_per_tok,
                 " exceeds the experts of topk_group = ", f->topk_group, " groups");
      XMOE_CHECK(!kimi || f->n_group == 1, r.field("n_group"), " = ", f->n_group,
                 " is not supported for model_type kimi_k2 (its router has a single group)");
    }
    XMOE_CHECK(!c.attention_bias, r.field("attention_bias"),
               " = true is not supported (DeepSeek-V3 checkpoints have no attention biases)");
    XMOE_CHECK(!c.tie_word_embeddings, r.field("tie_word_embeddings"), " = true is not supported");
    const std::string act = r.opt_string("hidden_act").value_or("silu");
    XMOE_CHECK(act == "silu", r.field("hidden_act"), " = '", act, "' is not supported (only 'silu')");
    if (r.has("topk_method")) {
      const std::string m = *r.opt_string("topk_method");
      XMOE_CHECK(m == "noaux_tc", r.field("topk_method"), " = '", m,
                 "' is not supported (DeepSeek-V3's noaux_tc: sigmoid with correction bias, group-limited)");
    }
    if (r.has("scoring_func")) {
      const std::string s = *r.opt_string("scoring_func");
      XMOE_CHECK(s == "sigmoid", r.field("scoring_func"), " = '", s, "' is not supported (only 'sigmoid')");
    }
    c.extension = std::move(f);
  }

  std::vector<PlannedTensor> tensors(const ModelConfig& c, ExpertLayout layout) const override {
    const DeepseekV3Fields& f = c.arch<DeepseekV3Fields>();
    const int64_t H = c.hidden_size, E = c.num_experts, I = c.moe_intermediate_size;
    const MlaDims dims = mla_dims(c);
    constexpr TensorRole kQuant = TensorRole::quantized_linear;
    std::vector<PlannedTensor> t;
    auto swiglu = [&](const DenseMlpNames& m, int64_t F) {
      t.push_back(random_tensor(m.gate, {F, H}, kQuant));
      t.back().scale_partner = m.up;
      t.push_back(random_tensor(m.up, {F, H}, kQuant));
      t.back().scale_partner = m.gate;
      t.push_back(random_tensor(m.down, {H, F}, kQuant));
    };
    t.push_back(random_tensor(Names::kEmbed, {c.vocab_size, H}));
    for (int i = 0; i < c.num_hidden_layers; ++i) {
      const DecoderLayerNames n = Names::decoder_layer(i);
      t.push_back(constant_tensor(n.input_norm, {H}, TensorInit::ones));
      add_mla_tensors(t, Names::mla(i), dims, H);
      if (f.index_topk > 0) {
        // As DeepSeek-V3.2 publishes them: wq_b and wk in FP8, weights_proj and the LayerNorm kept.
        const Names::Indexer x = Names::indexer(i);
        t.push_back(
            random_tensor(x.wq_b, {int64_t{f.index_n_heads} * f.index_head_dim, f.q_lora_rank}, kQuant));
        t.push_back(random_tensor(x.wk, {f.index_head_dim, H}, kQuant));
        t.push_back(constant_tensor(x.k_norm, {f.index_head_dim}, TensorInit::ones));
        t.push_back(constant_tensor(x.k_norm_bias, {f.index_head_dim}, TensorInit::zeros));
        t.push_back(random_tensor(x.weights_proj, {f.index_n_heads, H}, TensorRole::kept_linear));
      }
      t.push_back(constant_tensor(n.post_norm, {H}, TensorInit::ones));
      if (c.is_sparse_layer(i)) {
        const MoeNames m = Names::moe(i, c);
        t.push_back(random_tensor(m.router, {E, H}, TensorRole::kept_linear));
        t.push_back(constant_tensor(m.correction_bias, {E}, TensorInit::zeros));
        if (layout == ExpertLayout::per_expert) {
          for (int j = 0; j < E; ++j)
            swiglu({m.expert(j, "gate_proj"), m.expert(j, "up_proj"), m.expert(j, "down_proj")}, I);
        } else {
          // transformers v5's fused tensors: the per-expert tensors' random streams one after the other.
          PlannedTensor gate_up{
              m.fused_gate_up, {E, 2 * I, H}, TensorInit::normal, {}, TensorRole::other, ""};
          PlannedTensor down{m.fused_down, {E, H, I}, TensorInit::normal, {}, TensorRole::other, ""};
          for (int j = 0; j < E; ++j) {
            gate_up.segments.push_back({m.expert(j, "gate_proj"), I * H});
            gate_up.segments.push_back({m.expert(j, "up_proj"), I * H});
            down.segments.push_back({m.expert(j, "down_proj"), H * I});
          }
          t.push_back(std::move(gate_up));
          t.push_back(std::move(down));
        }
        if (m.shared_intermediate > 0) swiglu(m.shared, m.shared_intermediate);
      } else {
        swiglu(Names::dense(i), c.intermediate_size);
      }
    }
    t.push_back(constant_tensor(Names::kFinalNorm, {H}, TensorInit::ones));
    t.push_back(random_tensor(Names::kLmHead, {c.vocab_size, H}, TensorRole::kept_linear));
    return t;
  }

  std::unique_ptr<CausalLM> load(const Checkpoint& checkpoint, const LoadOptions& options) const override {
    const ModelConfig& c = checkpoint.config();
    const DeepseekV3Fields& f = c.arch<DeepseekV3Fields>();
    DecoderSpec spec;
    spec.embed = Names::kEmbed;
    spec.final_norm = Names::kFinalNorm;
    spec.lm_head = Names::kLmHead;
    spec.layer_names = &Names::decoder_layer;
    const MlaDims dims = mla_dims(c);
    spec.kv_latent_width = dims.latent_width();
    spec.attention_layer = [dims, c, f](int i, DecoderLoader& ld) -> std::unique_ptr<AttentionLayer> {
      const int64_t H = c.hidden_size;
      MlaWeights w = load_mla_weights(ld, Names::mla(i), dims, H);
      if (f.index_topk > 0) {
        // The indexer is not run (contexts stay within index_topk, where it selects every position); its
        // tensors are checked to be there with their shapes.
        const Names::Indexer x = Names::indexer(i);
        ld.matrix(x.wq_b, int64_t{f.index_n_heads} * f.index_head_dim, dims.q_lora_rank);
        ld.matrix(x.wk, f.index_head_dim, H);
        ld.vector(x.k_norm, f.index_head_dim);
        ld.vector(x.k_norm_bias, f.index_head_dim);
        ld.matrix(x.weights_proj, f.index_n_heads, H);
      }
      return std::make_unique<MlaAttention>(dims, std::move(w));
    };
    LlmRouterConfig router;
    router.type = c.model_type == "kimi_k2" ? LlmRouterType::kimi_k2 : LlmRouterType::deepseek_v3;
    router.num_experts = c.num_experts;
    router.top_k = c.num_experts_per_tok;
    router.norm_topk_prob = c.norm_topk_prob;
    router.n_group = f.n_group;
    router.topk_group = f.topk_group;
    router.routed_scaling_factor = f.routed_scaling_factor;
    spec.feed_forward = [router, c](int i, DecoderLoader& ld) -> std::unique_ptr<FeedForward> {
      if (c.is_sparse_layer(i))
        return load_swiglu_moe(ld, Names::moe(i, c), router, c.hidden_size, c.moe_intermediate_size, i);
      return load_dense_swiglu(ld, Names::dense(i), c.hidden_size, c.intermediate_size);
    };
    return load_decoder(checkpoint, options, std::move(spec));
  }

  InitModelSpec init_model_spec(const ModelConfig& c) const override {
    if (c.model_type == "kimi_k2") return kimi_k2_init_model_spec();
    InitModelSpec s;
    // DeepSeek-V3's tokenizer: begin/end of sentence and pad at ids 0-2, then the chat, thinking and
    // tool-call tokens its template uses.
    s.special_tokens = {{"<｜begin▁of▁sentence｜>", true},
                        {"<｜end▁of▁sentence｜>", true},
                        {"<｜▁pad▁｜>", true},
                        {"<｜User｜>", false},
                        {"<｜Assistant｜>", false},
                        {"<think>", false},
                        {"</think>", false},
                        {"<｜tool▁calls▁begin｜>", false},
                        {"<｜tool▁calls▁end｜>", false},
                        {"<｜tool▁call▁begin｜>", false},
                        {"<｜tool▁call▁end｜>", false},
                        {"<｜tool▁outputs▁begin｜>", false},
                        {"<｜tool▁outputs▁end｜>", false},
                        {"<｜tool▁output▁begin｜>", false},
                        {"<｜tool▁output▁end｜>", false},
                        {"<｜tool▁sep｜>", false}};
    // The main split of DeepSeek-V3's pre-tokenizer (its tokenizer.json also splits digits in threes and CJK
    // runs first; the byte-level tokenizer init-model writes has one split).
    s.split_regex = R"([\r\n]|\s?\p{L}+|\s?\p{P}+|\p{N}{1,3}|[^\s\p{L}\p{P}\p{N}]+|\s+(?!\S)|\s+)";
    s.chat_template = kDeepseekV3ChatTemplate;
    s.tokenizer_class = "LlamaTokenizerFast";
    s.bos_token = "<｜begin▁of▁sentence｜>";
    s.eos_token = "<｜end▁of▁sentence｜>";
    s.pad_token = "<｜end▁of▁sentence｜>";
    s.model_max_length = 131072;
    s.config_bos = "<｜begin▁of▁sentence｜>";
    s.config_eos = "<｜end▁of▁sentence｜>";
    s.generation_eos = {"<｜end▁of▁sentence｜>"};
    s.generation_pad = "<｜end▁of▁sentence｜>";
    // DeepSeek-V3's published generation defaults.
    s.sampling["do_sample"] = true;
    s.sampling["temperature"] = 0.6;
    s.sampling["top_p"] = 0.95;
    s.initializer_range = 0.02;
    return s;
  }

 private:
  bool v32_;
};

}  // namespace

const Architecture& deepseek_v3_architecture() {
  static const DeepseekV3 arch(false);
  return arch;
}

const Architecture& deepseek_v32_architecture() {
  static const DeepseekV3 arch(true);
  return arch;
}

}  // namespace xmoe::llm
