#include "kernels/quant/quantize.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/quant/codecs.hpp"
#include "xmoe/error.hpp"

namespace xmoe::kernels::quant {

PackedWeight QuantizedMatrix::view() const {
  PackedWeight p;
  p.format = format;
  p.rows = rows;
  p.cols = cols;
  p.data = reinterpret_cast<const std::byte*>(data.data());
  p.row_bytes = format == WeightFormat::fp8_block ? cols : cols / 2;
  p.scale_type = scale_type;
  p.scales = reinterpret_cast<const std::byte*>(scales.data());
  p.scale_row_stride = scale_shape.size() == 2 ? scale_shape[1] : 0;
  p.block_rows = block_rows;
  p.block_cols = block_cols;
  p.global_scale = global_scale;
  return p;
}

namespace {

float amax_of(const float* w, int64_t n) {
  float m = 0.0f;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(w[i]));
  return m;
}

// 2^⌈log2 x⌉ for a positive normal x, from its bits: a set mantissa bit means x is above its power of two.
float round_up_pow2(float x) {
  uint32_t bits = f32_to_bits(x) & 0x7F800000u;
  if (f32_to_bits(x) & 0x007FFFFFu) bits += 1u << 23;
  return bits_to_f32(bits);
}

void store_f32(std::vector<uint8_t>& out, size_t index, float v) {
  std::memcpy(out.data() + 4 * index, &v, 4);
}

void check_shape(const char* what, int64_t rows, int64_t cols, int64_t multiple) {
  XMOE_CHECK(rows > 0 && cols > 0, what, ": matrix shape [", rows, ", ", cols, "] must be positive");
  XMOE_CHECK(cols % multiple == 0, what, ": columns (", cols, ") must be a multiple of ", multiple);
}

}  // namespace

QuantizedMatrix quantize_fp8_block(const float* w, int64_t rows, int64_t cols, bool ue8m0, int block) {
  check_shape("fp8_block quantize", rows, cols, 1);
  XMOE_CHECK(block > 0, "fp8_block quantize: block size ", block, " must be positive");
  QuantizedMatrix q;
  q.format = WeightFormat::fp8_block;
  q.rows = rows;
  q.cols = cols;
  q.scale_type = ScaleType::f32;
  q.block_rows = q.block_cols = block;
  const int64_t srows = (rows + block - 1) / block, scols = (cols + block - 1) / block;
  q.scale_shape = {srows, scols};
  q.scales.resize(static_cast<size_t>(srows * scols) * 4);
  q.data.resize(static_cast<size_t>(rows * cols));
  // Blocks are independent: threads change nothing in the result.
#pragma omp parallel for collapse(2) schedule(static) if (rows * cols > (1 << 18))
  for (int64_t br = 0; br < srows; ++br)
    for (int64_t bc = 0; bc < scols; ++bc) {
      const int64_t r0 = br * block, r1 = std::min(rows, r0 + block);
      const int64_t c0 = bc * block, c1 = std::min(cols, c0 + block);
      float amax = 0.0f;
      for (int64_t r = r0; r < r1; ++r) amax = std::max(amax, amax_of(w + r * cols + c0, c1 - c0));
      // torch evaluates `448 / amax` (a Python scalar over a tensor) as amax.reciprocal() * 448: the same
      // order here gives transformers' scales bit for bit.
      float scale = amax > 0.0f ? (1.0f / amax) * kE4M3Max : 1.0f;
      float inv = 1.0f / scale;
      if (ue8m0) {
        inv = round_up_pow2(std::max(inv, std::numeric_limits<float>::min()));
        scale = 1.0f / inv;
      }
      store_f32(q.scales, static_cast<size_t>(br * scols + bc), inv);
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) {
          float v = w[r * cols + c] * scale;
          if (v > kE4M3Max) v = kE4M3Max;  // NaN passes through, as torch.clamp lets it
          if (v < -kE4M3Max) v = -kE4M3Max;
          q.data[static_cast<size_t>(r * cols + c)] = f32_to_e4m3(v);
        }
    }
  return q;
}

QuantizedMatrix quantize_mxfp4(const float* w, int64_t rows, int64_t cols) {
  check_shape("mxfp4 quantize", rows, cols, 32);
  QuantizedMatrix q;
  q.format = WeightFormat::mxfp4;
  q.rows = rows;
  q.cols = cols;
  q.scale_type = ScaleType::e8m0;
  q.block_rows = 1;
  q.block_cols = 32;
  q.scale_shape = {rows, cols / 32};
  q.scales.resize(static_cast<size_t>(rows * cols / 32));
  q.data.resize(static_cast<size_t>(rows * cols / 2));
#pragma omp parallel for schedule(static) if (rows * cols > (1 << 18))
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < cols / 32; ++b) {
      const float* src = w + r * cols + b * 32;
      const float dequant_scale = amax_of(src, 32) / kE2M1Max;
      const uint32_t rounded_bits = (f32_to_bits(dequant_scale) + 0x007FFFFFu) & 0x7F800000u;
      const float rounded = bits_to_f32(rounded_bits);
      const float quant_scale = rounded == 0.0f ? 0.0f : 1.0f / rounded;
      q.scales[static_cast<size_t>(r * (cols / 32) + b)] = static_cast<uint8_t>(rounded_bits >> 23);
      uint8_t* dst = q.data.data() + r * (cols / 2) + b * 16;
      for (int j = 0; j < 16; ++j)
        dst[j] = static_cast<uint8_t>(f32_to_e2m1(src[2 * j] * quant_scale) |
                                      (f32_to_e2m1(src[2 * j + 1] * quant_scale) << 4));
    }
  return q;
}

float nvfp4_weight_scale_2(const float* w, int64_t n) {
  return amax_of(w, n) / (kE2M1Max * kE4M3Max);
}

QuantizedMatrix quantize_nvfp4(const float* w, int64_t rows, int64_t cols, float weight_scale_2) {
  check_shape("nvfp4 quantize", rows, cols, 16);
  QuantizedMatrix q;
  q.format = WeightFormat::nvfp4;
  q.rows = rows;
  q.cols = cols;
  q.scale_type = ScaleType::e4m3;
  q.block_rows = 1;
  q.block_cols = 16;
  q.global_scale = weight_scale_2;
  q.scale_shape = {rows, cols / 16};
  q.scales.resize(static_cast<size_t>(rows * cols / 16));
  q.data.resize(static_cast<size_t>(rows * cols / 2));
  const float six_gs = kE2M1Max * weight_scale_2;
  const auto nibble = [](float v) { return f32_to_e2m1(v == 0.0f ? 0.0f : v); };  // w < 0 decides the sign
#pragma omp parallel for schedule(static) if (rows * cols > (1 << 18))
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < cols / 16; ++b) {
      const float* src = w + r * cols + b * 16;
      float block_scale = amax_of(src, 16) / six_gs;
      if (block_scale == 0.0f) block_scale = 1.0f;
      const uint8_t code = f32_to_e4m3(block_scale);
      q.scales[static_cast<size_t>(r * (cols / 16) + b)] = code;
      const float divisor = e4m3_to_f32(code) * weight_scale_2;
      uint8_t* dst = q.data.data() + r * (cols / 2) + b * 8;
      for (int j = 0; j < 8; ++j)
        dst[j] = static_cast<uint8_t>(nibble(src[2 * j] / divisor) | (nibble(src[2 * j + 1] / divisor) << 4));
    }
  return q;
}

QuantizedMatrix quantize_nvfp4(const float* w, int64_t rows, int64_t cols) {
  return quantize_nvfp4(w, rows, cols, nvfp4_weight_scale_2(w, rows * cols));
}

}  // namespace xmoe::kernels::quant
