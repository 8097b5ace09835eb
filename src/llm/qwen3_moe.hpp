// Qwen3MoeForCausalLM (transformers models/qwen3_moe/modeling_qwen3_moe.py): token embeddings; per layer
// RMSNorm → GQA attention (q/k RMSNorm per head before RoPE) → residual → RMSNorm → MoE block (softmax top-k
// router, optional renormalisation, SwiGLU experts run through moe/RoutedExperts) or dense SwiGLU MLP →
// residual; final RMSNorm; lm_head (tied to the embeddings or not).
#pragma once
#include <memory>

#include "llm/model.hpp"

namespace xmoe::llm {

std::unique_ptr<CausalLM> load_qwen3_moe(const Checkpoint& checkpoint, const LoadOptions& options);

}  // namespace xmoe::llm
