// Rotary position embedding with transformers' inverse frequencies and attention scaling for rope_scaling
// types default, linear, dynamic (NTK, recomputed from the sequence length as transformers does), yarn and
// llama3 (modeling_rope_utils.py). Rotation: rotate_half convention (pairs i and i + d/2) over the leading
// d = rotary_dim values of each head (partial RoPE: the rest pass through unchanged).
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include "llm/model_config.hpp"

namespace xmoe::llm {

class Rope {
 public:
  // Throws naming rope_scaling.type when it is not supported.
  Rope(const ModelConfig& config);
  // Rotates `heads` rows of head_dim values (stride head_dim) of one token at `position` (their leading
  // rotary_dim values); seq_len is the
  // sequence's length after this step (only dynamic scaling reads it).
  void apply(float* x, int heads, int64_t position, int64_t seq_len) const;
  // The same for two sets of head rows of one token (a query's and its key's heads), the angles computed
  // once.
  void apply(float* x, int heads, float* x2, int heads2, int64_t position, int64_t seq_len) const;
  const std::vector<float>& inv_freq() const { return inv_freq_; }
  float attention_scaling() const { return attention_scaling_; }

 private:
  const std::vector<float>& frequencies(int64_t seq_len, std::vector<float>& scratch) const;
  int dim_ = 0;  // rotary dimension
  int head_dim_ = 0;
  double base_ = 10000.0;
  std::optional<RopeScaling> scaling_;
  int64_t max_position_ = 0;
  std::vector<float> inv_freq_;
  float attention_scaling_ = 1.0f;
};

}  // namespace xmoe::llm
