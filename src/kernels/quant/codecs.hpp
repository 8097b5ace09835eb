// The element and scale codes of the published quantized formats, decoded exactly as PyTorch decodes every
// code point and encoded from f32 as the reference casts and quantizers round:
//  * E4M3 (torch.float8_e4m3fn): bias 7, subnormals, no infinities, S.1111.111 is NaN (0x7F / 0xFF);
//  * E2M1 (OCP MX FP4): ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}, bit 3 the sign;
//  * E8M0 (torch.float8_e8m0fnu): 2^(e − 127), 0xFF is NaN, no sign and no zero.
#pragma once
#include <array>
#include <cstdint>
#include <cstring>
#include <limits>

namespace xmoe::kernels::quant {

inline constexpr float kE4M3Max = 448.0f;
inline constexpr float kE2M1Max = 6.0f;
inline constexpr std::array<float, 16> kE2M1Values = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                                      -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

inline float bits_to_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t f32_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Bit manipulation only (no floating-point arithmetic), so the result does not depend on the FPU's
// denormals-are-zero mode: normals rebias the exponent (7 → 127), subnormals m · 2^-9 are normal in f32.
inline float e4m3_to_f32(uint8_t code) {
  const uint32_t sign = static_cast<uint32_t>(code & 0x80) << 24;
  const uint32_t mag = code & 0x7F;
  if (mag == 0x7F) return bits_to_f32(sign | 0x7FC00000u);
  if (mag >= 8) return bits_to_f32(sign | ((mag << 20) + (120u << 23)));
  if (mag == 0) return bits_to_f32(sign);
  // m · 2^-9 with m in 1..7: normalise the 3-bit mantissa by hand.
  int shift = 0;
  uint32_t m = mag;
  while (!(m & 8)) {
    m <<= 1;
    ++shift;
  }
  return bits_to_f32(sign | ((127u - 6 - static_cast<uint32_t>(shift)) << 23) | ((m & 7) << 20));
}

inline float e2m1_to_f32(uint8_t nibble) {
  return kE2M1Values[nibble & 0xF];
}

inline float e8m0_to_f32(uint8_t code) {
  if (code == 0xFF) return std::numeric_limits<float>::quiet_NaN();
  if (code == 0) return bits_to_f32(0x00400000u);  // 2^-127 is an f32 subnormal
  return bits_to_f32(static_cast<uint32_t>(code) << 23);
}

// f32 → E4M3 as torch's CPU cast `x.to(torch.float8_e4m3fn)` does (checked against torch 2.15 on every
// boundary by tools/make_quant_fixtures.py): round to nearest even; magnitudes above 448's upper midpoint and
// ±inf saturate to ±448; NaN becomes 0x7F with its sign bit. (c10's older scalar fp8e4m3fn_from_fp32_value
// turned out-of-range values into NaN; the quantizers clamp to ±448 first, so they agree under either.)
uint8_t f32_to_e4m3(float x);
// f32 → E2M1 nibble, round to nearest even, saturating at ±6, the sign taken from the sign bit (−0 → 0x8), as
// triton_kernels' downcast_to_mxfp (RTNE version) and the OCP MX spec's conversion do.
uint8_t f32_to_e2m1(float x);

}  // namespace xmoe::kernels::quant
