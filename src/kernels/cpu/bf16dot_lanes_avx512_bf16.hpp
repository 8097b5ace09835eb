// Register helpers shared by the VDPBF16PS linears (BF16 and quantized weights): the fixed lane tree (from
// linear_reduce_avx512.hpp) and the exact f32 -> bf16 rounding of activations. Included only by files
// compiled for AVX512-BF16.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/linear_reduce_avx512.hpp"

namespace xmoe::kernels::avx512_bf16 {

using lane_tree::reduce16;

// Masks of the first `bytes` bytes of 64 and the first `lanes` dwords of 16.
inline __mmask64 byte_mask(int64_t bytes) {
  return bytes >= 64 ? ~__mmask64(0) : (__mmask64(1) << bytes) - 1;
}
inline __mmask16 lane_mask(int64_t lanes) {
  return lanes >= 16 ? __mmask16(0xffff) : __mmask16((1u << lanes) - 1);
}

// 16 f32 -> bf16 bits exactly as bf16::from_float (nearest even; NaN made quiet), integer arithmetic only.
// maskz forms: the unmasked intrinsics start from an undefined register, which GCC 12 warns about.
inline __m256i round_to_bf16(__m512i u) {
  const __m512i high = _mm512_maskz_srli_epi32(0xffff, u, 16);
  const __m512i lsb = _mm512_and_si512(high, _mm512_set1_epi32(1));
  __m512i r = _mm512_maskz_srli_epi32(
      0xffff, _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  r = _mm512_mask_or_epi32(r, nan, high, _mm512_set1_epi32(0x40));
  return _mm512_maskz_cvtepi32_epi16(0xffff, r);
}

}  // namespace xmoe::kernels::avx512_bf16
