// GptOssForCausalLM (transformers models/gpt_oss/modeling_gpt_oss.py): token embeddings; per layer RMSNorm →
// GQA attention with q/k/v/o biases, YaRN RoPE, a learned sink logit per head, and a sliding window on the
// layers layer_types marks "sliding_attention" → residual → RMSNorm → MoE block (router with bias: top-k on
// the logits, softmax over the chosen k; experts with biases, gate/up rows interleaved, clamped SwiGLU
// (up + 1) · g · σ(alpha · g)) → residual; final RMSNorm; untied lm_head. Weights as published: MXFP4 experts
// (*_blocks / *_scales, read in place) and BF16 for the rest, or everything BF16/F32 (experts then stored as
// transformers holds them: gate_up_proj [E, H, 2I], down_proj [E, I, H], transposed here once at load).
#include <algorithm>
#include <cstring>
#include <string>

#include "llm/arch/architecture.hpp"
#include "llm/arch/decoder.hpp"
#include "llm/arch/gpt_oss_chat_template.hpp"
#include "llm/layers/quantized_views.hpp"
#include "moe/linear_router.hpp"
#include "moe/routed_experts.hpp"
#include "xmoe/error.hpp"

namespace xmoe::llm {

namespace {

using kernels::PackedWeight;

// config.json fields only gpt-oss has.
struct GptOssFields final : ArchitectureConfig {
  double swiglu_alpha = 1.702, swiglu_limit = 7.0;
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
    n.attention.sinks = p + "self_attn.sinks";
    return n;
  }
  struct Moe {
    std::string router, router_bias, gate_up, gate_up_bias, down, down_bias;
  };
  static Moe moe(int i) {
    const std::string p = layer(i) + "mlp.";
    return {p + "router.weight",        p + "router.bias",
            p + "experts.gate_up_proj", p + "experts.gate_up_proj_bias",
            p + "experts.down_proj",    p + "experts.down_proj_bias"};
  }
  static constexpr const char* kEmbed = "model.embed_tokens.weight";
  static constexpr const char* kFinalNorm = "model.norm.weight";
  static constexpr const char* kLmHead = "lm_head.weight";
};

// The MoE block: router → dispatch → experts → combine through the shared moe/ stages.
class GptOssMoe final : public FeedForward {
 public:
  GptOssMoe(moe::LinearRouter router, std::vector<moe::SwigluWeights> experts,
            const moe::ExpertDescriptor& descriptor, const kernels::KernelTable& table,
            std::vector<std::unique_ptr<std::byte[]>> owned)
      : owned_(std::move(owned)),
        router_(std::move(router)),
        experts_(std::move(experts), table, descriptor),
        E_(router_.config().num_experts),
        k_(router_.config().top_k) {}

  uint64_t forward(const float* x, int64_t T, float* y, moe::ExpertScratch& scratch) override {
    ids_.resize(static_cast<size_t>(T * k_));
    weights_.resize(ids_.size());
    router_.route(x, T, ids_.data(), weights_.data());
    chosen_.assign(static_cast<size_t>(E_), 0);
    for (int32_t id : ids_) chosen_[static_cast<size_t>(id)] = 1;
    experts_.forward(x, T, k_, ids_.data(), weights_.data(), y, scratch);
    return static_cast<uint64_t>(std::count(chosen_.begin(), chosen_.end(), 1)) * expert_bytes();
  }
  size_t fixed_bytes() const override { return router_.bytes(); }
  size_t per_token_bytes() const override { return static_cast<size_t>(k_) * expert_bytes(); }

 private:
  size_t expert_bytes() const { return experts_.experts().expert(0).bytes(); }
  std::vector<std::unique_ptr<std::byte[]>> owned_;  // transposed plain expert weights (views point here)
  moe::LinearRouter router_;
  moe::RoutedExperts experts_;
  int E_, k_;
  std::vector<int32_t> ids_;
  std::vector<float> weights_;
  std::vector<char> chosen_;
};

// The plain (BF16/F16/F32) fused expert tensor `name` [E, in, out] as transformers holds it (x @ W), as E
// [out, in] linears in the model's dtype, transposed into a buffer kept in `owned`.
std::vector<PackedWeight> transposed_experts(DecoderLoader& loader, const std::string& name, int64_t E,
                                             int64_t in, int64_t out,
                                             std::vector<std::unique_ptr<std::byte[]>>& owned) {
  const int64_t shape[] = {E, in, out};
  const WeightView v = loader.checkpoint().weight(name, shape);
  const bool bf16 = loader.dtype() == DType::bf16;
  const int64_t elem = bf16 ? 2 : 4, per_expert = in * out;
  owned.push_back(std::make_unique<std::byte[]>(static_cast<size_t>(E * per_expert * elem)));
  std::byte* base = owned.back().get();
  std::vector<float> f32(static_cast<size_t>(bf16 ? 0 : per_expert));
  std::vector<uint16_t> b16(static_cast<size_t>(bf16 ? per_expert : 0));
  std::vector<PackedWeight> views;
  for (int64_t e = 0; e < E; ++e) {
    std::byte* dst = base + e * per_expert * elem;
    if (bf16) {
      v.to_bf16(e * per_expert, per_expert, b16.data());
      auto* d = reinterpret_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < in; ++i)
        for (int64_t o = 0; o < out; ++o) d[o * in + i] = b16[static_cast<size_t>(i * out + o)];
    } else {
      v.to_f32(e * per_expert, per_expert, f32.data());
      auto* d = reinterpret_cast<float*>(dst);
      for (int64_t i = 0; i < in; ++i)
        for (int64_t o = 0; o < out; ++o) d[o * in + i] = f32[static_cast<size_t>(i * out + o)];
    }
    PackedWeight w;
    w.format = bf16 ? kernels::WeightFormat::bf16 : kernels::WeightFormat::f32;
    w.rows = out;
    w.cols = in;
    w.data = dst;
    w.row_bytes = in * elem;
    views.push_back(w);
  }
  return views;
}

// Rows of the 2-D bias `name` [E, n] in f32.
std::vector<std::vector<float>> expert_biases(const Checkpoint& ckpt, const std::string& name, int64_t E,
                                              int64_t n) {
  const int64_t shape[] = {E, n};
  const WeightView v = ckpt.weight(name, shape);
  std::vector<std::vector<float>> rows(static_cast<size_t>(E), std::vector<float>(static_cast<size_t>(n)));
  for (int64_t e = 0; e < E; ++e) v.to_f32(e * n, n, rows[static_cast<size_t>(e)].data());
  return rows;
}

std::unique_ptr<FeedForward> load_moe(DecoderLoader& loader, const ModelConfig& c, int layer) {
  const Checkpoint& ckpt = loader.checkpoint();
  const Names::Moe n = Names::moe(layer);
  const int E = c.num_experts;
  const int64_t H = c.hidden_size, I = c.moe_intermediate_size;
  LlmRouterConfig rc;
  rc.type = LlmRouterType::gpt_oss;
  rc.num_experts = E;
  rc.top_k = c.num_experts_per_tok;
  moe::LinearRouter router(loader.matrix(n.router, E, H), loader.vector(n.router_bias, E), rc,
                           loader.table());

  std::vector<moe::SwigluWeights> experts(static_cast<size_t>(E));
  std::vector<std::unique_ptr<std::byte[]>> owned;
  std::vector<PackedWeight> gate_up, down;
  // Quantized experts are stored output rows first ([E, 2I, H/32, 16]: gate_up row 2j is gate j, 2j + 1 up
  // j) and are read in place; plain ones are transformers' [E, H, 2I] and [E, I, H].
  if (quantized_view(ckpt, n.gate_up, 2 * I, H, E)) {
    gate_up = loader.weights().stacked(n.gate_up, E, 2 * I, H);
    down = loader.weights().stacked(n.down, E, H, I);
  } else {
    gate_up = transposed_experts(loader, n.gate_up, E, H, 2 * I, owned);
    down = transposed_experts(loader, n.down, E, I, H, owned);
  }
  const auto gate_up_bias = expert_biases(ckpt, n.gate_up_bias, E, 2 * I);
  const auto down_bias = expert_biases(ckpt, n.down_bias, E, H);
  for (size_t e = 0; e < experts.size(); ++e) {
    experts[e].gate_up = gate_up[e];
    experts[e].down = down[e];
    experts[e].gate_up_bias = gate_up_bias[e];
    experts[e].down_bias = down_bias[e];
  }
  loader.report();
  const GptOssFields& f = c.arch<GptOssFields>();
  const auto descriptor =
      moe::ExpertDescriptor::gpt_oss(static_cast<float>(f.swiglu_alpha), static_cast<float>(f.swiglu_limit));
  return std::make_unique<GptOssMoe>(std::move(router), std::move(experts), descriptor, loader.table(),
                                     std::move(owned));
}

class GptOss final : public Architecture {
 public:
  std::string_view name() const override { return "GptOssForCausalLM"; }
  std::string_view model_type() const override { return "gpt_oss"; }

  void parse_config(const FieldReader& r, ModelConfig& c) const override {
    // transformers' GptOssConfig (v5) defaults.
    DecoderDefaults d;
    d.vocab_size = 201088;
    d.hidden_size = 2880;
    d.intermediate_size = 2880;
    d.moe_intermediate_size = 2880;
    d.num_hidden_layers = 36;
    d.num_attention_heads = 64;
    d.num_key_value_heads = 8;
    d.num_experts = 128;
    d.num_experts_per_tok = 4;
    d.rms_norm_eps = 1e-5;
    d.rope_theta = 150000.0;
    d.max_position_embeddings = 131072;
    d.attention_bias = true;
    parse_decoder_fields(r, d, c);
    parse_moe_fields(r, d, c);
    // The experts' width is intermediate_size (gpt-oss has no moe_intermediate_size).
    XMOE_CHECK(!r.has("moe_intermediate_size") ||
                   r.get_int("moe_intermediate_size", 0, 1, kMaxConfigSize) == c.intermediate_size,
               r.field("moe_intermediate_size"), " must equal intermediate_size (", c.intermediate_size,
               ") for gpt-oss, whose experts are intermediate_size wide");
    c.moe_intermediate_size = c.intermediate_size;
    if (!r.has("sliding_window")) c.sliding_window = 128;
    parse_layer_types(r, c);
    if (!r.has("layer_types")) {
      // GptOssConfig's default: sliding, full, sliding, full, …
      c.layer_types.clear();
      for (int i = 0; i < c.num_hidden_layers; ++i)
        c.layer_types.push_back(i % 2 == 0 ? AttentionKind::sliding : AttentionKind::full);
    }
    if (!c.rope_scaling) {
      // GptOssConfig's default rope_parameters.
      RopeScaling y;
      y.type = "yarn";
      y.factor = 32.0;
      y.original_max_position_embeddings = 4096;
      y.beta_fast = 32.0;
      y.beta_slow = 1.0;
      y.truncate = false;
      c.rope_scaling = y;
    }
    XMOE_CHECK(c.rotary_dim == c.head_dim, r.field("partial_rotary_factor"), " = ", c.partial_rotary_factor,
               " is not supported (gpt-oss rotates the whole head)");
    XMOE_CHECK(!c.tie_word_embeddings, r.field("tie_word_embeddings"),
               " = true is not supported by GptOssForCausalLM (its lm_head is its own)");
    XMOE_CHECK(c.attention_bias, r.field("attention_bias"),
               " = false is not supported by GptOssForCausalLM (its projections have biases)");
    for (int i = 0; i < c.num_hidden_layers; ++i)
      XMOE_CHECK(c.is_sparse_layer(i), r.where(), ": layer ", i,
                 " would be dense; every gpt-oss layer is a MoE layer (check decoder_sparse_step / "
                 "mlp_only_layers)");
    auto f = std::make_shared<GptOssFields>();
    f->swiglu_alpha = r.get_positive("swiglu_alpha", 1.702);
    f->swiglu_limit = r.get_positive("swiglu_limit", 7.0);
    c.extension = std::move(f);
  }

  std::vector<PlannedTensor> tensors(const ModelConfig& c, ExpertLayout) const override {
    const int64_t H = c.hidden_size, D = c.head_dim, E = c.num_experts, I = c.moe_intermediate_size;
    const int64_t q_dim = int64_t{c.num_attention_heads} * D, kv_dim = int64_t{c.num_key_value_heads} * D;
    constexpr TensorRole kKept = TensorRole::kept_linear;
    std::vector<PlannedTensor> t;
    t.push_back(random_tensor(Names::kEmbed, {c.vocab_size, H}));
    for (int i = 0; i < c.num_hidden_layers; ++i) {
      const DecoderLayerNames n = Names::decoder_layer(i);
      t.push_back(constant_tensor(n.input_norm, {H}, TensorInit::ones));
      // gpt-oss publishes its attention unquantized (modules_to_not_convert: model.layers.*.self_attn).
      t.push_back(random_tensor(n.attention.q + ".weight", {q_dim, H}, kKept));
      t.push_back(random_tensor(n.attention.q + ".bias", {q_dim}));
      t.push_back(random_tensor(n.attention.k + ".weight", {kv_dim, H}, kKept));
      t.push_back(random_tensor(n.attention.k + ".bias", {kv_dim}));
      t.push_back(random_tensor(n.attention.v + ".weight", {kv_dim, H}, kKept));
      t.push_back(random_tensor(n.attention.v + ".bias", {kv_dim}));
      t.push_back(random_tensor(n.attention.o + ".weight", {H, q_dim}, kKept));
      t.push_back(random_tensor(n.attention.o + ".bias", {H}));
      t.push_back(random_tensor(n.attention.sinks, {c.num_attention_heads}));
      t.push_back(constant_tensor(n.post_norm, {H}, TensorInit::ones));
      const Names::Moe m = Names::moe(i);
      t.push_back(random_tensor(m.router, {E, H}, kKept));
      t.push_back(random_tensor(m.router_bias, {E}));
      // The experts as transformers holds them (x @ W): [E, H, 2I] with gate/up columns interleaved, [E, I,
      // H].
      t.push_back(random_tensor(m.gate_up, {E, H, 2 * I}, TensorRole::mxfp4_experts));
      t.push_back(constant_tensor(m.gate_up_bias, {E, 2 * I}, TensorInit::zeros));
      t.push_back(random_tensor(m.down, {E, I, H}, TensorRole::mxfp4_experts));
      t.push_back(constant_tensor(m.down_bias, {E, H}, TensorInit::zeros));
    }
    t.push_back(constant_tensor(Names::kFinalNorm, {H}, TensorInit::ones));
    t.push_back(random_tensor(Names::kLmHead, {c.vocab_size, H}, kKept));
    return t;
  }

  std::unique_ptr<CausalLM> load(const Checkpoint& checkpoint, const LoadOptions& options) const override {
    const ModelConfig& c = checkpoint.config();
    DecoderSpec spec;
    spec.embed = Names::kEmbed;
    spec.final_norm = Names::kFinalNorm;
    spec.lm_head = Names::kLmHead;
    spec.attention.qkv_bias = spec.attention.o_bias = true;
    spec.attention.sinks = true;
    spec.layer_names = &Names::decoder_layer;
    spec.feed_forward = [c](int i, DecoderLoader& loader) { return load_moe(loader, c, i); };
    return load_decoder(checkpoint, options, std::move(spec));
  }

  InitModelSpec init_model_spec(const ModelConfig&) const override {
    InitModelSpec s;
    // o200k_harmony's special tokens (gpt-oss's tokenizer.json; reserved ones left out).
    for (const char* t : {"<|startoftext|>", "<|endoftext|>", "<|return|>", "<|constrain|>", "<|channel|>",
                          "<|start|>", "<|end|>", "<|message|>", "<|call|>", "<|endofprompt|>"})
      s.special_tokens.push_back({t, true});
    // tiktoken's o200k_base pattern, as gpt-oss's tokenizer.json carries it.
    s.split_regex =
        R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
    s.chat_template = kGptOssChatTemplate;
    s.tokenizer_class = "PreTrainedTokenizerFast";
    s.bos_token = "<|startoftext|>";
    s.eos_token = "<|return|>";
    s.pad_token = "<|endoftext|>";
    s.model_max_length = 131072;
    s.config_bos = "<|startoftext|>";
    s.config_eos = "<|return|>";
    // generation_config.json of openai/gpt-oss-*: <|return|>, <|endoftext|> and <|call|> end a turn.
    s.generation_eos = {"<|return|>", "<|endoftext|>", "<|call|>"};
    s.generation_pad = "<|endoftext|>";
    s.sampling["do_sample"] = true;
    s.initializer_range = 0.02;
    return s;
  }
};

}  // namespace

const Architecture& gpt_oss_architecture() {
  static const GptOss arch;
  return arch;
}

}  // namespace xmoe::llm
