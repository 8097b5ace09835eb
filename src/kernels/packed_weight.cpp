#include "kernels/packed_weight.hpp"

#include <cstring>

#include "kernels/quant/block_scale.hpp"
#include "kernels/quant/codecs.hpp"
#include "xmoe/dtype.hpp"
#include "xmoe/error.hpp"

namespace xmoe::kernels {

const char* weight_format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::f32:
      return "f32";
    case WeightFormat::bf16:
      return "bf16";
    case WeightFormat::f16:
      return "f16";
    case WeightFormat::fp8_block:
      return "fp8_block";
    case WeightFormat::mxfp4:
      return "mxfp4";
    case WeightFormat::nvfp4:
      return "nvfp4";
  }
  return "?";
}

size_t PackedWeight::bytes() const {
  size_t n = static_cast<size_t>(rows * row_bytes);
  if (scale_type != ScaleType::none) {
    const int64_t scale_rows = (rows + block_rows - 1) / block_rows;
    const size_t scale_size = scale_type == ScaleType::f32 ? 4 : 1;
    n += static_cast<size_t>(scale_rows * scale_row_stride) * scale_size;
  }
  return n;
}

namespace {

float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    u = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    u = sign;
  } else {  // subnormal: normalise
    exp = 113;
    while (!(mant & 0x400u)) {
      mant <<= 1;
      --exp;
    }
    u = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace

void PackedWeight::row_to_f32(int64_t r, float* out) const {
  XMOE_CHECK(r >= 0 && r < rows, "packed weight: row ", r, " out of range [0, ", rows, ")");
  const std::byte* p = data + r * row_bytes;
  switch (format) {
    case WeightFormat::f32:
      std::memcpy(out, p, static_cast<size_t>(cols) * 4);
      return;
    case WeightFormat::bf16:
      for (int64_t c = 0; c < cols; ++c) {
        uint16_t b;
        std::memcpy(&b, p + 2 * c, 2);
        out[c] = bf16::to_float(b);
      }
      return;
    case WeightFormat::f16:
      for (int64_t c = 0; c < cols; ++c) {
        uint16_t h;
        std::memcpy(&h, p + 2 * c, 2);
        out[c] = half_to_float(h);
      }
      return;
    case WeightFormat::fp8_block:
      for (int64_t c = 0; c < cols; ++c)
        out[c] = quant::e4m3_to_f32(static_cast<uint8_t>(p[c])) * quant::block_multiplier(*this, r, c);
      return;
    case WeightFormat::mxfp4:
    case WeightFormat::nvfp4:
      for (int64_t c = 0; c < cols; ++c) {
        const uint8_t byte = static_cast<uint8_t>(p[c / 2]);
        out[c] =
            quant::e2m1_to_f32(c % 2 == 0 ? byte & 0xF : byte >> 4) * quant::block_multiplier(*this, r, c);
      }
      return;
  }
  throw Error(std::string("packed weight: no decoder for format ") + weight_format_name(format));
}

}  // namespace xmoe::kernels
