// The reusable decoder of the architecture kit: token embeddings; per layer RMSNorm → attention → residual →
// RMSNorm → feed-forward block → residual; final RMSNorm; lm_head (tied to the embeddings or not). An
// architecture describes its tensor names, attention options and feed-forward block (dense MLP, MoE with its
// router kind and expert descriptor) in a DecoderSpec; the decoder loads and runs them.
//
// Attention options (per model; the window is per layer, from ModelConfig::layer_types): GQA, RMSNorm of each
// q and k head before RoPE, partial RoPE (ModelConfig::rotary_dim), QKV and O biases, learned sinks per
// head, sliding window with the KV cache's ring for that layer. MLA would be another attention kind with its
// own projections and cache layout; it is not implemented.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/kernels.hpp"
#include "kernels/packed_weight.hpp"
#include "llm/arch/attention_block.hpp"
#include "llm/layers/weights.hpp"
#include "llm/model.hpp"
#include "moe/expert_scratch.hpp"

namespace xmoe::llm {

// What an architecture's hooks load weights through: views over the checkpoint in the model's dtype, f32
// vectors, the kernel table, and progress.
class DecoderLoader {
 public:
  DecoderLoader(const Checkpoint& ckpt, const LoadOptions& options);
  const Checkpoint& checkpoint() const { return ckpt_; }
  const ModelConfig& config() const { return ckpt_.config(); }
  DType dtype() const { return dtype_; }
  const kernels::KernelTable& table() const { return *table_; }
  // The 2-D weight `name` as [rows, cols] (quantized formats read in place).
  kernels::PackedWeight matrix(const std::string& name, int64_t rows, int64_t cols);
  // Each [rows, cols] slice of the 3-D weight `name` [count, rows, cols].
  std::vector<kernels::PackedWeight> stacked(const std::string& name, int64_t count, int64_t rows,
                                             int64_t cols);
  // A 1-D tensor [n] in f32 (norm weights, biases, sinks).
  std::vector<float> vector(const std::string& name, int64_t n);
  void report();  // progress after a load that bypassed matrix()/vector()
  WeightLoader& weights() { return weights_; }

 private:
  Checkpoint ckpt_;  // a copy: the caller's may go once the model is loaded
  DType dtype_;
  const kernels::KernelTable* table_;
  WeightLoader weights_;
  ProgressFn progress_;
  size_t vector_bytes_ = 0, total_bytes_ = 0;
};

// A layer's feed-forward block (dense MLP or MoE).
class FeedForward {
 public:
  virtual ~FeedForward() = default;
  // y [T, H] = block(x [T, H]), its rows in `scratch` (the model's, lent to each layer in turn). Returns the
  // bytes of expert weights the call read (each expert any token chose, once); 0 for a dense block.
  virtual uint64_t forward(const float* x, int64_t T, float* y, moe::ExpertScratch& scratch) = 0;
  virtual size_t fixed_bytes() const = 0;      // weights every step reads (dense weights, router)
  virtual size_t per_token_bytes() const = 0;  // weights one token reads besides (its experts)
  // Where the block times its router and experts from now on (null: not timed); a block that does not
  // leaves its whole time to the decoder's experts scope.
  virtual void set_profile(StepProfile* /*profile*/) {}
};

// A layer's attention: out [T, H] = attention over x [T, H] (the normed hidden states) for the step's rows,
// writing the new positions into layer `layer` of the cache (reserved by the caller) without advancing its
// lengths. GQA (AttentionBlock) is one kind, MLA another.
class AttentionLayer {
 public:
  virtual ~AttentionLayer() = default;
  virtual void forward(const kernels::KernelTable& table, const Rope& rope, const StepRows& step,
                       KvCache& cache, int layer, const float* x, float* out, AttentionScratch& scratch) = 0;
  virtual size_t bytes() const = 0;  // weights one step reads
};

// Checkpoint names of one layer's attention: projection modules ("<module>.weight", "<module>.bias") and the
// q/k norm weights and sinks tensor where the options use them.
struct AttentionNames {
  std::string q, k, v, o;
  std::string q_norm, k_norm;
  std::string sinks;
};

struct DecoderLayerNames {
  std::string input_norm, post_norm;  // weight tensors
  AttentionNames attention;
};

struct DecoderSpec {
  std::string embed, final_norm, lm_head;  // weight tensors (lm_head unused when tie_word_embeddings)
  AttentionOptions attention;
  std::function<DecoderLayerNames(int layer)> layer_names;
  // The feed-forward block of layer `layer`, loaded through the loader.
  std::function<std::unique_ptr<FeedForward>(int layer, DecoderLoader& loader)> feed_forward;
  // Another attention kind than GQA: layer `layer`'s attention (then `attention` and the attention names
  // are not used), with the cache layout it needs: kv_latent_width > 0 = every layer caches one vector of
  // that many values per token (KvCacheShape::layer_latent) instead of K and V per kv head.
  std::function<std::unique_ptr<AttentionLayer>(int layer, DecoderLoader& loader)> attention_layer;
  int kv_latent_width = 0;
};

// Loads the decoder described by `spec` for the checkpoint's config (sizes, rotary_dim, RoPE scaling,
// rms_norm_eps, per-layer windows, tie_word_embeddings).
std::unique_ptr<CausalLM> load_decoder(const Checkpoint& checkpoint, const LoadOptions& options,
                                       DecoderSpec spec);

}  // namespace xmoe::llm
