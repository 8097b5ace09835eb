// Decoding one block scale of a PackedWeight (f32 multiplier, E8M0 or E4M3 code) to f32.
#pragma once
#include <cstdint>
#include <cstring>

#include "kernels/packed_weight.hpp"
#include "kernels/quant/codecs.hpp"

namespace xmoe::kernels::quant {

inline float decode_scale(ScaleType type, const std::byte* scales, int64_t index) {
  switch (type) {
    case ScaleType::f32: {
      float s;
      std::memcpy(&s, scales + 4 * index, 4);
      return s;
    }
    case ScaleType::e8m0:
      return e8m0_to_f32(static_cast<uint8_t>(scales[index]));
    case ScaleType::e4m3:
      return e4m3_to_f32(static_cast<uint8_t>(scales[index]));
    case ScaleType::none:
      break;
  }
  return 1.0f;
}

// The multiplier applied to every element of block (r / block_rows, c / block_cols): the decoded block scale,
// times the global scale for NVFP4 (one f32 product, as ModelOpt's dequantisation computes
// `weight_scale.float() * weight_scale_2` before multiplying the elements).
inline float block_multiplier(const PackedWeight& w, int64_t r, int64_t c) {
  const float s =
      decode_scale(w.scale_type, w.scales, (r / w.block_rows) * w.scale_row_stride + c / w.block_cols);
  return w.format == WeightFormat::nvfp4 ? s * w.global_scale : s;
}

}  // namespace xmoe::kernels::quant
