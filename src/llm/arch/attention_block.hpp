// A decoder layer's attention block: x → q/k/v projections (+ biases) → q/k RMSNorm per head → RoPE (partial
// where rotary_dim < head_dim) → K/V into the layer's cache (paged or a sliding ring) → causal GQA attention
// (window, sinks) → o projection (+ bias). One step serves many sequences at once; a sequence's results do
// not depend on the rest of the batch.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "kernels/kernels.hpp"
#include "kernels/packed_weight.hpp"
#include "llm/kv_cache.hpp"
#include "llm/layers/rope.hpp"
#include "llm/step_profile.hpp"
#include "util/buffer.hpp"

namespace xmoe::llm {

struct AttentionOptions {
  bool qk_norm = false;   // RMSNorm (eps = the model's rms_norm_eps) over each q and k head before RoPE
  bool qkv_bias = false;  // q/k/v projections have biases
  bool o_bias = false;    // the output projection has a bias
  bool sinks = false;     // a learned logit per query head in the softmax denominator (gpt-oss)
  float scale = 0.0f;     // q·k scale; 0 = 1/sqrt(head_dim)
};

// The rows of one engine step: chunk c appends tokens [first[c], first[c + 1]) of the step to sequence
// seq[c], at positions start[c], start[c] + 1, ...
struct StepRows {
  std::vector<SequenceId> seq;
  std::vector<int64_t> first, start;
  std::vector<int64_t> chunk_of;  // by row
  int64_t rows() const { return first.empty() ? 0 : first.back(); }
};

struct AttentionWeights {
  kernels::PackedWeight q, k, v, o;                   // [heads·D, H], [kv·D, H] ×2, [H, heads·D]
  std::vector<float> q_bias, k_bias, v_bias, o_bias;  // with qkv_bias / o_bias
  std::vector<float> q_norm, k_norm;                  // [D] with qk_norm
  std::vector<float> sinks;                           // [heads] with sinks
};

// MLA's rows between its projections (MlaAttention::attend): the absorbed form's gathered queries, latent
// queries and outputs; the expanded form's f32 latents and, per chunk, expanded K and V (84 MB a chunk of 512
// positions at DeepSeek-V3's shape, which a buffer per call took as fresh pages at every layer).
struct MlaScratch {
  Buffer<float> gathered, latent_q, latent_out, out_rows, latents;
  std::vector<Buffer<float>> keys, values;
};

// Scratch shared by the layers of a model (sized by the largest step).
struct AttentionScratch {
  Buffer<float> qkv, attn;
  MlaScratch mla;
  StepProfile* profile = nullptr;  // where the block times its projections (null: not timed)
};

class AttentionBlock {
 public:
  // window: 0 = full causal attention, else the last `window` positions (the cache layer must match).
  AttentionBlock(const AttentionOptions& options, int heads, int kv_heads, int head_dim, int64_t window,
                 float eps, AttentionWeights weights);

  // out [T, H] = the block applied to x [T, H] (the normed hidden states) for the step's rows; writes the new
  // positions' K/V into layer `layer` of the cache (reserved by the caller) without advancing its lengths.
  void forward(const kernels::KernelTable& table, const Rope& rope, const StepRows& step, KvCache& cache,
               int layer, const float* x, float* out, AttentionScratch& scratch) const;

  size_t bytes() const;  // weights one step reads
  int64_t window() const { return window_; }

 private:
  AttentionOptions options_;
  int heads_, kv_heads_, head_dim_;
  int64_t window_;
  float eps_;
  AttentionWeights w_;
  std::vector<kernels::PackedWeight> qkv_parts_;  // q, k, v; one joined view when back to back
  std::vector<float> qkv_bias_;                   // q, k, v biases side by side
};

}  // namespace xmoe::llm
