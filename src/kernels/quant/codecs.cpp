#include "kernels/quant/codecs.hpp"

namespace xmoe::kernels::quant {

uint8_t f32_to_e4m3(float x) {
  constexpr uint32_t kSaturate = 0x43E80000u;  // 464.0f, the midpoint above 448: from here on ±448
  constexpr uint32_t kMinNormal = 121u << 23;  // 2^-6
  constexpr uint32_t kDenormMagic = 141u << 23;
  uint32_t bits = f32_to_bits(x);
  const uint32_t sign = bits & 0x80000000u;
  bits ^= sign;
  uint8_t code;
  if (bits > 0x7F800000u) {
    code = 0x7F;
  } else if (bits > kSaturate) {
    code = 0x7E;
  } else if (bits < kMinNormal) {
    // Adding 2^14 aligns the subnormal grid (2^-9) with f32's last mantissa bit, so the FPU's own
    // round-to-nearest-even does the rounding.
    const float sum = bits_to_f32(bits) + bits_to_f32(kDenormMagic);
    code = static_cast<uint8_t>(f32_to_bits(sum) - kDenormMagic);
  } else {
    const uint32_t mant_odd = (bits >> 20) & 1;
    bits += (static_cast<uint32_t>(7 - 127) << 23) + 0x7FFFFu + mant_odd;
    code = static_cast<uint8_t>(bits >> 20);
  }
  return static_cast<uint8_t>(code | (sign >> 24));
}

uint8_t f32_to_e2m1(float x) {
  const uint32_t bits = f32_to_bits(x);
  const uint8_t sign = static_cast<uint8_t>((bits >> 28) & 0x8);
  const float a = bits_to_f32(bits & 0x7FFFFFFFu);
  // Midpoints between neighbours; at a tie the even code (mantissa bit 0) wins: 0.25 → 0, 0.75 → 1, 1.25 → 1,
  // 1.75 → 2, 2.5 → 2, 3.5 → 4, 5 → 4.
  uint8_t code;
  if (a <= 0.25f)
    code = 0;
  else if (a < 0.75f)
    code = 1;
  else if (a <= 1.25f)
    code = 2;
  else if (a < 1.75f)
    code = 3;
  else if (a <= 2.5f)
    code = 4;
  else if (a < 3.5f)
    code = 5;
  else if (a <= 5.0f)
    code = 6;
  else
    code = 7;  // saturates (NaN too, as the reference's integer path does for exponent 0xFF)
  return static_cast<uint8_t>(sign | code);
}

}  // namespace xmoe::kernels::quant
