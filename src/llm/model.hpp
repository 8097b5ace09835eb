// A causal LM loaded from a Hugging Face checkpoint, run one engine step at a time over many sequences.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kernels/linear_precision.hpp"
#include "llm/checkpoint.hpp"
#include "llm/kv_cache.hpp"
#include "llm/model_config.hpp"
#include "llm/step_profile.hpp"
#include "xmoe/dtype.hpp"

namespace xmoe::llm {

struct LoadOptions {
  DType dtype = DType::bf16;  // weights and activations: bf16 (f32 accumulation) or f32
  std::string isa;            // kernel level cap, as MoeConfig::isa; empty = best this CPU runs
  ProgressFn progress;        // bytes of weights loaded so far
  // Arithmetic of the linears over BF16, FP8, MXFP4 and NVFP4 weights (kernels/linear_precision.hpp); medium
  // falls back to highest on a kernel level without bf16 products (the table's `precision` says which ran).
  kernels::MatmulPrecision matmul_precision = kernels::MatmulPrecision::highest;
};

// One sequence's part of a step: new tokens appended at positions [cache length, cache length + n).
struct SequenceChunk {
  SequenceId seq = 0;
  std::span<const int32_t> tokens;
  bool all_logits = false;  // logits for every new token (tests, prompt scoring); else only the last one
};

class CausalLM {
 public:
  virtual ~CausalLM() = default;
  virtual const ModelConfig& config() const = 0;
  virtual DType dtype() const = 0;
  // The cache layout the model runs on (from the config: kv heads, head_dim, windows); a model with
  // another attention kind (MLA's latent vector) says its own.
  virtual KvCacheShape kv_cache_shape() const;
  // Runs the chunks as one batch (their tokens concatenated through every layer, attention per sequence over
  // its cache). The caller has reserved cache room for every new token; the model writes K/V and advances
  // each sequence's cache length. logits: rows in chunk order (one per chunk, or one per token where
  // all_logits), each vocab_size f32. Results for a sequence do not depend on what else is in the batch.
  virtual void forward(std::span<const SequenceChunk> batch, KvCache& cache, std::vector<float>& logits) = 0;
  // Bytes of weights a decode step of one token reads (attention, router, k experts per MoE layer, norms,
  // lm_head): for the bandwidth figure of the benchmark.
  virtual size_t weight_bytes_per_token() const = 0;
  // Bytes of weights every forward so far has read: each matrix once per forward, each MoE layer's experts
  // that any token of the step chose once, and the tokens' embedding rows (what a step streams from memory).
  virtual uint64_t weight_bytes_read() const = 0;
  // Times each forward's ops into `profile` from now on (null: stop). A model without its own timing leaves
  // the whole forward to the caller's scope.
  virtual void set_profile(StepProfile* /*profile*/) {}
};

// Picks the architecture from config.json's "architectures" (throws naming the unknown one). The model reads
// weights from the checkpoint's mapped files in place and keeps them mapped for its lifetime (the checkpoint
// object itself may go).
std::unique_ptr<CausalLM> load_model(const Checkpoint& checkpoint, const LoadOptions& options);

}  // namespace xmoe::llm
