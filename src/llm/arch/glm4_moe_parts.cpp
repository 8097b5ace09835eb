#include "llm/arch/glm4_moe_parts.hpp"

#include "xmoe/error.hpp"
#include "xmoe/llm_routing.hpp"

namespace xmoe::llm {

namespace {

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

}  // namespace

GlmMoeFields parse_glm_moe_fields(const FieldReader& r, const ModelConfig& c,
                                  double default_routed_scaling_factor, int default_mtp_layers) {
  GlmMoeFields f;
  f.n_shared_experts = static_cast<int>(r.get_int("n_shared_experts", 1, 0, kMaxConfigInt));
  f.n_group = static_cast<int>(r.get_int("n_group", 1, 1, kMaxConfigInt));
  f.topk_group = static_cast<int>(r.get_int("topk_group", 1, 1, kMaxConfigInt));
  f.routed_scaling_factor = r.get_positive("routed_scaling_factor", default_routed_scaling_factor);
  const char* mtp_key = r.has("num_mtp_layers") ? "num_mtp_layers" : "num_nextn_predict_layers";
  f.num_nextn_predict_layers = static_cast<int>(r.get_int(mtp_key, default_mtp_layers, 0, 1 << 10));
  const int E = c.num_experts;
  XMOE_CHECK(E % f.n_group == 0, r.field("n_group"), " = ", f.n_group, " must divide n_routed_experts = ", E);
  XMOE_CHECK(f.n_group == 1 || E / f.n_group >= 2, r.field("n_group"), " = ", f.n_group,
             " leaves groups of one expert (a group's score is the sum of its two best experts)");
  XMOE_CHECK(f.topk_group <= f.n_group, r.field("topk_group"), " = ", f.topk_group,
             " exceeds n_group = ", f.n_group);
  XMOE_CHECK(c.num_experts_per_tok <= f.topk_group * (E / f.n_group), r.field("num_experts_per_tok"), " = ",
             c.num_experts_per_tok, " exceeds the experts of topk_group groups (", f.topk_group, " x ",
             E / f.n_group, ")");
  if (r.has("topk_method")) {
    const std::string m = *r.opt_string("topk_method");
    XMOE_CHECK(m == "noaux_tc", r.field("topk_method"), " = '", m,
               "' is not supported (GLM's noaux_tc: sigmoid with correction bias, group-limited)");
  }
  const std::string act = r.opt_string("hidden_act").value_or("silu");
  XMOE_CHECK(act == "silu", r.field("hidden_act"), " = '", act, "' is not supported (only 'silu')");
  return f;
}

std::string glm_layer_prefix(int layer) {
  return "model.layers." + std::to_string(layer) + ".";
}

MoeNames glm_moe_names(int layer, const ModelConfig& c, const GlmMoeFields& f) {
  const std::string p = glm_layer_prefix(layer) + "mlp.";
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
  n.shared_intermediate = c.moe_intermediate_size * f.n_shared_experts;
  return n;
}

DenseMlpNames glm_dense_names(int layer) {
  const std::string p = glm_layer_prefix(layer) + "mlp.";
  return {p + "gate_proj.weight", p + "up_proj.weight", p + "down_proj.weight"};
}

void add_glm_feed_forward(std::vector<PlannedTensor>& t, const ModelConfig& c, const GlmMoeFields& f,
                          int layer, ExpertLayout layout) {
  const int64_t H = c.hidden_size, E = c.num_experts, I = c.moe_intermediate_size;
  if (!c.is_sparse_layer(layer)) {
    add_dense_mlp(t, glm_dense_names(layer), H, c.intermediate_size);
    return;
  }
  // Glm4MoeMoE's module order: experts, gate, shared_experts.
  const MoeNames m = glm_moe_names(layer, c, f);
  if (layout == ExpertLayout::per_expert) {
    for (int j = 0; j < E; ++j) {
      add_pair(t, m.expert(j, "gate_proj"), m.expert(j, "up_proj"), I, H);
      t.push_back(random_tensor(m.expert(j, "down_proj"), {H, I}, kQuant));
    }
  } else {
    // A fused tensor is its per-expert tensors' random streams one after the other.
    PlannedTensor gate_up{m.fused_gate_up, {E, 2 * I, H}, TensorInit::normal, {}, TensorRole::other, ""};
    PlannedTensor down{m.fused_down, {E, H, I}, TensorInit::normal, {}, TensorRole::other, ""};
    for (int j = 0; j < E; ++j) {
      gate_up.segments.push_back({m.expert(j, "gate_proj"), H * I});
      gate_up.segments.push_back({m.expert(j, "up_proj"), H * I});
      down.segments.push_back({m.expert(j, "down_proj"), H * I});
    }
    t.push_back(std::move(gate_up));
    t.push_back(std::move(down));
  }
  t.push_back(random_tensor(m.router, {E, H}, TensorRole::kept_linear));
  t.push_back(constant_tensor(m.correction_bias, {E}, TensorInit::zeros));
  if (m.shared_intermediate > 0) add_dense_mlp(t, m.shared, H, m.shared_intermediate);
}

void add_glm_mtp_extras(std::vector<PlannedTensor>& t, const ModelConfig& c, int layer) {
  const int64_t H = c.hidden_size, V = c.vocab_size;
  const std::string p = glm_layer_prefix(layer);
  t.push_back(random_tensor(p + "embed_tokens.weight", {V, H}));
  t.push_back(constant_tensor(p + "enorm.weight", {H}, TensorInit::ones));
  t.push_back(constant_tensor(p + "hnorm.weight", {H}, TensorInit::ones));
  t.push_back(random_tensor(p + "eh_proj.weight", {H, 2 * H}, TensorRole::kept_linear));
  t.push_back(constant_tensor(p + "shared_head.norm.weight", {H}, TensorInit::ones));
  t.push_back(random_tensor(p + "shared_head.head.weight", {V, H}, TensorRole::kept_linear));
}

std::unique_ptr<FeedForward> load_glm_feed_forward(DecoderLoader& loader, const ModelConfig& c,
                                                   const GlmMoeFields& f, int layer) {
  if (!c.is_sparse_layer(layer))
    return load_dense_swiglu(loader, glm_dense_names(layer), c.hidden_size, c.intermediate_size);
  LlmRouterConfig router;
  router.type = LlmRouterType::deepseek_v3;
  router.num_experts = c.num_experts;
  router.top_k = c.num_experts_per_tok;
  router.norm_topk_prob = c.norm_topk_prob;
  router.n_group = f.n_group;
  router.topk_group = f.topk_group;
  router.routed_scaling_factor = f.routed_scaling_factor;
  return load_swiglu_moe(loader, glm_moe_names(layer, c, f), router, c.hidden_size, c.moe_intermediate_size,
                         layer);
}

InitModelSpec glm_init_model_spec(std::string_view chat_template) {
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
  s.chat_template = std::string(chat_template);
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

}  // namespace xmoe::llm
