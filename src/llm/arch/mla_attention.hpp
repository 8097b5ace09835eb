// Multi-head latent attention (DeepSeek-V2/V3, transformers' DeepseekV3Attention) over a latent KV cache.
//
// q = q_b(RMSNorm(q_a(x))) (q_lora_rank > 0) or q_proj(x), per head [q_nope (nope), q_pe (rope)];
// kv_a_proj_with_mqa(x) = [c_kv (kv_lora_rank), k_pe (rope)], c_kv RMSNorm'd (eps 1e-6, as transformers'
// DeepseekV3RMSNorm default); RoPE on q_pe and the one shared k_pe (interleaved pairs when rope_interleave:
// even/odd values de-interleaved first, as apply_rotary_pos_emb_interleave). The cache keeps only
// [c_kv, k_pe] per token (kv_lora_rank + rope values). kv_b_proj maps c_kv to each head's [k_nope (nope),
// v (v_head_dim)]; score = scale · (q_nope·k_nope + q_pe·k_pe).
//
// Two exact forms of the same attention:
// - absorbed (decode: a chunk of one token): W_UK folded into the query, q_lat = W_UKᵀ q_nope, scores
//   q_lat·c_kv + q_pe·k_pe straight over the cached latents, o_lat = Σ p·c_kv, then W_UV o_lat: flash
//   attention with one K/V head of kv_lora + rope values that every query head shares, V the first kv_lora
//   of them; the W_UK / W_UV products are per-head linears over all the step's rows.
// - expanded (prefill: longer chunks): k_nope and v of every cached position from kv_b_proj (two GEMMs over
//   the sequence's latents), then ordinary multi-head flash attention over K = [k_nope | k_pe], V.
// kv_b_proj is dequantised to f32 at load (FP8 block or BF16 in the checkpoint): both forms read that copy.
#pragma once
#include <cstdint>
#include <vector>

#include <string>

#include "kernels/packed_weight.hpp"
#include "llm/arch/config_fields.hpp"
#include "llm/arch/decoder.hpp"
#include "llm/arch/tensor_plan.hpp"
#include "llm/model_config.hpp"

namespace xmoe::llm {

struct MlaDims {
  int heads = 0;
  int q_lora_rank = 0;  // 0: q_proj straight from the hidden state
  int kv_lora_rank = 0, qk_nope = 0, qk_rope = 0, v_head = 0;
  float scale = 0;              // softmax scale (qk_head_dim^-0.5 · mscale² under YaRN)
  bool rope_interleave = true;  // the checkpoint's rope dims are interleaved pairs
  float latent_eps = 1e-6f;     // q_a_layernorm / kv_a_layernorm
  // The longest context this attention is exact for (0 = any): DeepSeek-V3.2's sparse attention equals
  // dense MLA up to index_topk positions; longer contexts are refused naming it.
  int64_t max_context = 0;
  int latent_width() const { return kv_lora_rank + qk_rope; }
  int qk_head() const { return qk_nope + qk_rope; }
};

struct MlaWeights {
  kernels::PackedWeight q;         // [heads·qk_head, H] without q_lora
  kernels::PackedWeight q_a, q_b;  // [q_lora, H], [heads·qk_head, q_lora] with q_lora
  std::vector<float> q_a_norm;     // [q_lora]
  kernels::PackedWeight kv_a;      // [kv_lora + rope, H]
  std::vector<float> kv_a_norm;    // [kv_lora]
  kernels::PackedWeight kv_b;      // [heads·(nope + v), kv_lora], any format
  kernels::PackedWeight o;         // [H, heads·v]
};

// Which form runs a chunk: automatic = absorbed for one-token chunks, expanded for longer ones.
enum class MlaForm { automatic, absorbed, expanded };

class MlaAttention final : public AttentionLayer {
 public:
  MlaAttention(const MlaDims& dims, MlaWeights weights, MlaForm form = MlaForm::automatic);

  void forward(const kernels::KernelTable& table, const Rope& rope, const StepRows& step, KvCache& cache,
               int layer, const float* x, float* out, AttentionScratch& scratch) override;
  size_t bytes() const override;

  // The attention between the projections: q [T, heads·qk_head] (RoPE applied) of the step's rows over the
  // cache (their latent rows already written) into attn [T, heads·v_head]. Both forms run through
  // kernels::attention: the absorbed form's chunks in one call with every head on the one latent K/V head,
  // the expanded form's in another over their sequences' expanded K/V.
  void attend(const kernels::KernelTable& table, KvCache& cache, int layer, const StepRows& step,
              const float* q, float* attn, MlaScratch& scratch) const;

 private:
  bool absorbs(int64_t rows) const;            // whether a chunk of `rows` rows runs in the absorbed form
  kernels::PackedWeight uk_view(int h) const;  // W_UK[h]ᵀ, [kv_lora, nope]
  kernels::PackedWeight uv_view(int h) const;  // W_UV[h], [v_head, kv_lora]
  void attend_absorbed(const kernels::KernelTable& table, KvCache& cache, int layer, const StepRows& step,
                       const std::vector<size_t>& chunks, const float* q, float* attn,
                       MlaScratch& scratch) const;
  void attend_expanded(const kernels::KernelTable& table, KvCache& cache, int layer, const StepRows& step,
                       const std::vector<size_t>& chunks, const float* q, float* attn,
                       MlaScratch& scratch) const;

  MlaDims d_;
  MlaWeights w_;
  MlaForm form_;
  // kv_b_proj in f32 (any checkpoint format) as per-head blocks: uk_t_ = [heads][kv_lora][nope] (W_UKᵀ),
  // uv_ = [heads][v_head][kv_lora] (W_UV).
  std::vector<float> uk_t_, uv_;
};

// The parts an architecture with MLA layers shares (DeepSeek-V3/V3.2, Kimi-K2, GLM-4.7-Flash).

// One layer's MLA weight tensors under `prefix` ("model.layers.3.self_attn.").
struct MlaNames {
  std::string q, q_a, q_a_norm, q_b, kv_a, kv_a_norm, kv_b, o;
};
MlaNames mla_names(const std::string& prefix);

// config.json's q_lora_rank: null = no query compression (0, q_proj); absent = the config class's default.
int parse_q_lora_rank(const FieldReader& r, int class_default);

// qk_head^-0.5, times mscale(factor, mscale_all_dim)² when RoPE scaling other than "default" sets
// mscale_all_dim (transformers' DeepseekV3Attention / yarn_apply_mscale).
float mla_softmax_scale(const FieldReader& r, const ModelConfig& c, int qk_head);

// The layer's MLA tensors in module order, every projection quantized (as DeepSeek publishes them in FP8).
void add_mla_tensors(std::vector<PlannedTensor>& t, const MlaNames& n, const MlaDims& d, int64_t hidden);

// The layer's MLA weights, read through the loader.
MlaWeights load_mla_weights(DecoderLoader& ld, const MlaNames& n, const MlaDims& d, int64_t hidden);

}  // namespace xmoe::llm
