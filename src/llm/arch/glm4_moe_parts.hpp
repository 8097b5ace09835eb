// What GLM-4.5+ (Glm4MoeForCausalLM, GQA attention) and GLM-4.7-Flash (Glm4MoeLiteForCausalLM, MLA attention)
// share: the feed-forward side of a layer (dense SwiGLU MLP, or the MoE block of transformers' Glm4MoeMoE:
// sigmoid router with e_score_correction_bias, n_group / topk_group, norm_topk_prob, routed_scaling_factor,
// SwiGLU experts and n_shared_experts shared experts), its checkpoint names and tensor plan, and the names of
// the multi-token-prediction layers' own tensors, init-model's tokenizer settings.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include <string_view>

#include "llm/arch/architecture.hpp"
#include "llm/arch/config_fields.hpp"
#include "llm/arch/decoder.hpp"
#include "llm/arch/feed_forward.hpp"
#include "llm/arch/tensor_plan.hpp"

namespace xmoe::llm {

struct GlmMoeFields {
  int n_shared_experts = 1;
  int n_group = 1, topk_group = 1;
  double routed_scaling_factor = 1.0;
  int num_nextn_predict_layers = 1;  // MTP layers, stored after the decoder layers; never loaded
};

// n_shared_experts, n_group, topk_group, routed_scaling_factor and num_nextn_predict_layers (or its alias
// num_mtp_layers), with the config class's defaults, checked against c's expert count and top-k
// (parse_moe_fields first); errors name the field.
GlmMoeFields parse_glm_moe_fields(const FieldReader& r, const ModelConfig& c,
                                  double default_routed_scaling_factor, int default_mtp_layers);

std::string glm_layer_prefix(int layer);  // "model.layers.<i>."
MoeNames glm_moe_names(int layer, const ModelConfig& c, const GlmMoeFields& f);
DenseMlpNames glm_dense_names(int layer);

// Layer i's feed-forward tensors in module order: the dense MLP, or the experts (per-expert or fused),
// router, correction bias and shared experts. Linears are quantized_linear, the router kept_linear (GLM's FP8
// checkpoints keep mlp.gate), the correction bias zeros (transformers' init).
void add_glm_feed_forward(std::vector<PlannedTensor>& t, const ModelConfig& c, const GlmMoeFields& f,
                          int layer, ExpertLayout layout);
// An MTP layer's tensors besides its decoder layer's: embed_tokens, enorm, hnorm, eh_proj [H, 2H],
// shared_head.norm, shared_head.head (its projections kept unquantized, like the router and lm_head).
void add_glm_mtp_extras(std::vector<PlannedTensor>& t, const ModelConfig& c, int layer);

// Layer i's feed-forward block (c.is_sparse_layer(i) picks the MoE block).
std::unique_ptr<FeedForward> load_glm_feed_forward(DecoderLoader& loader, const ModelConfig& c,
                                                   const GlmMoeFields& f, int layer);

// init-model's tokenizer and generation settings of the GLM-4.5+ family: its added tokens in id order, the
// GLM-4 pre-tokenizer split, no BOS, <|endoftext|> / <|user|> / <|observation|> ending a turn (GLM-4.6's
// generation_config), with the given chat template.
InitModelSpec glm_init_model_spec(std::string_view chat_template);

}  // namespace xmoe::llm
