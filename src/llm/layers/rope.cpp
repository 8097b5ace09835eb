#include "llm/layers/rope.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "xmoe/error.hpp"

namespace xmoe::llm {

namespace {

// base ** (arange(0, dim, 2) / dim) and its inverse, in f32 as torch computes them.
std::vector<float> default_inv_freq(double base, int dim) {
  std::vector<float> inv(static_cast<size_t>(dim / 2));
  for (int i = 0; i < dim / 2; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(dim);
    inv[static_cast<size_t>(i)] = 1.0f / std::pow(static_cast<float>(base), exponent);
  }
  return inv;
}

float yarn_mscale(double scale) {
  return scale <= 1 ? 1.0f : static_cast<float>(0.1 * std::log(scale) + 1.0);
}

}  // namespace

Rope::Rope(const ModelConfig& c)
    : dim_(c.rotary_dim > 0 ? c.rotary_dim : c.head_dim),
      head_dim_(c.head_dim),
      base_(c.rope_theta),
      scaling_(c.rope_scaling),
      max_position_(c.max_position_embeddings) {
  XMOE_CHECK(dim_ > 0 && dim_ % 2 == 0 && dim_ <= head_dim_,
             "rope: the rotary dimension must be even, > 0 and <= head_dim ", head_dim_, ", got ", dim_);
  inv_freq_ = default_inv_freq(base_, dim_);
  if (!scaling_ || scaling_->type == "default") return;
  const RopeScaling& s = *scaling_;
  const double factor = s.factor;
  if (s.type == "linear") {
    for (float& f : inv_freq_) f /= static_cast<float>(factor);
  } else if (s.type == "dynamic") {
    // Frequencies depend on the sequence length; computed per call (see frequencies()).
  } else if (s.type == "yarn") {
    const int64_t original = s.original_max_position_embeddings > 0 ? s.original_max_position_embeddings
                                                                    : c.max_position_embeddings;
    attention_scaling_ = s.attention_factor ? static_cast<float>(*s.attention_factor) : yarn_mscale(factor);
    const double d = dim_;
    auto correction_dim = [&](double rotations) {
      return (d * std::log(static_cast<double>(original) / (rotations * 2 * std::numbers::pi))) /
             (2 * std::log(base_));
    };
    double low = correction_dim(s.beta_fast), high = correction_dim(s.beta_slow);
    if (s.truncate) low = std::floor(low), high = std::ceil(high);
    low = std::max(low, 0.0), high = std::min(high, d - 1);
    if (low == high) high += 0.001;
    for (int i = 0; i < dim_ / 2; ++i) {
      const float exponent = static_cast<float>(2 * i) / static_cast<float>(dim_);
      const float pos_freq = std::pow(static_cast<float>(base_), exponent);
      const float extrapolation = 1.0f / pos_freq;
      const float interpolation = 1.0f / (static_cast<float>(factor) * pos_freq);
      const float ramp = std::clamp(
          (static_cast<float>(i) - static_cast<float>(low)) / static_cast<float>(high - low), 0.0f, 1.0f);
      const float extrapolation_factor = 1.0f - ramp;
      inv_freq_[static_cast<size_t>(i)] =
          interpolation * (1.0f - extrapolation_factor) + extrapolation * extrapolation_factor;
    }
  } else if (s.type == "llama3") {
    const double original = static_cast<double>(s.original_max_position_embeddings);
    XMOE_CHECK(original > 0, "rope_scaling.original_max_position_embeddings: llama3 needs it > 0");
    const double low_wavelen = original / s.low_freq_factor, high_wavelen = original / s.high_freq_factor;
    for (float& f : inv_freq_) {
      const float wavelen = static_cast<float>(2 * std::numbers::pi) / f;
      const float scaled = wavelen > low_wavelen ? f / static_cast<float>(factor) : f;
      if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
        const float smooth =
            (static_cast<float>(original) / wavelen - static_cast<float>(s.low_freq_factor)) /
            static_cast<float>(s.high_freq_factor - s.low_freq_factor);
        f = (1 - smooth) * scaled / static_cast<float>(factor) + smooth * scaled;
      } else {
        f = scaled;
      }
    }
  } else {
    XMOE_CHECK(false, "rope_scaling.type: '", s.type,
               "' is not supported (expected default, linear, dynamic, yarn or llama3)");
  }
}

const std::vector<float>& Rope::frequencies(int64_t seq_len, std::vector<float>& scratch) const {
  if (!scaling_ || scaling_->type != "dynamic" || seq_len <= max_position_) return inv_freq_;
  // transformers' dynamic NTK: the base grows with the sequence length once it passes
  // max_position_embeddings (computed in f32 from a tensor seq_len).
  const float factor = static_cast<float>(scaling_->factor);
  const float ratio = factor * static_cast<float>(seq_len) / static_cast<float>(max_position_) - (factor - 1);
  const double base = base_ * std::pow(static_cast<double>(ratio), static_cast<double>(dim_) / (dim_ - 2));
  scratch = default_inv_freq(base, dim_);
  return scratch;
}

void Rope::apply(float* x, int heads, int64_t position, int64_t seq_len) const {
  apply(x, heads, nullptr, 0, position, seq_len);
}

void Rope::apply(float* x, int heads, float* x2, int heads2, int64_t position, int64_t seq_len) const {
  std::vector<float> scratch;
  const std::vector<float>& inv = frequencies(seq_len, scratch);
  const int half = dim_ / 2;
  float cos_v[512], sin_v[512];
  XMOE_CHECK(half <= 512, "rope: rotary dimension ", dim_, " above the supported 1024");
  for (int i = 0; i < half; ++i) {
    const float angle = static_cast<float>(position) * inv[static_cast<size_t>(i)];
    cos_v[i] = static_cast<float>(std::cos(static_cast<double>(angle))) * attention_scaling_;
    sin_v[i] = static_cast<float>(std::sin(static_cast<double>(angle))) * attention_scaling_;
  }
  // Partial rotary: the leading dim_ values of each head rotate, the rest pass through.
  const auto rotate = [&](float* rows, int count) {
    for (int h = 0; h < count; ++h) {
      float* v = rows + static_cast<int64_t>(h) * head_dim_;
      for (int i = 0; i < half; ++i) {
        const float a = v[i], b = v[i + half];
        v[i] = a * cos_v[i] - b * sin_v[i];
        v[i + half] = b * cos_v[i] + a * sin_v[i];
      }
    }
  };
  rotate(x, heads);
  if (x2) rotate(x2, heads2);
}

}  // namespace xmoe::llm
