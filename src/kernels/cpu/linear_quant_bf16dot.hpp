// The arithmetic of the `medium` matmul precision (linear_precision.hpp) for block-quantized weights, which
// the AVX512-BF16 kernels and their scalar reference share. Each weight code becomes a bf16 exactly: an E2M1
// value as it is; an E4M3 value times 2^-8 (normal in bf16 for every code, subnormals included, so
// VDPBF16PS's denormals-are-zero never drops one). The block multiplier q (quant::block_multiplier: E8M0 /
// E4M3 / f32 scale, times NVFP4's global scale) is applied by format:
//  * FP8 block: to the activations. x'[p] = bf16(x[i, p] · (q(n, p) · 2^8)): the f32 product rounded to
//    nearest even with an f32 subnormal product read as zero (VCVTNE2PS2BF16; NaN made quiet), zeros past k.
//    Output (i, n) is BF16 medium's arithmetic (linear_bf16dot.hpp: one 16-lane VDPBF16PS chain over all
//    of k, pairs (2l, 2l+1) of each step of 32 words, the fixed lane tree) over x' and the codes, both in
//    chunk order: k padded to a multiple of 64 with zeros, and in each chunk of 64 elements step 0 holds
//    the even elements and step 1 the odd ones, in order (so lane l's pairs are elements (4l, 4l+2) and
//    (4l+1, 4l+3): what 64 codes read as 32 words give as their low and high bytes). The multipliers of a
//    block of rows are one f32 vector over k, so the scaling costs k products per x row and 128 weight rows,
//    and the products then run at BF16's rate with no per-block step;
//  * MXFP4: to the codes. w'[n, p] = bf16(e2m1 · 2^(code - 127)), exact for scale codes 2..252 (a power of
//    two times an E2M1 value stays a normal bf16); other codes give what bf16::from_float gives (subnormal,
//    read as zero by VDPBF16PS; inf; NaN). Each activation is rounded to bf16. Output (i, n) is one 16-lane
//    VDPBF16PS chain over all of k as in BF16 medium, over x and w' in FP4 chunk order (below);
//  * NVFP4: to f32 partial sums (its E4M3 × f32 multipliers are not powers of two). Each activation is
//    rounded to bf16; k is cut into chunks of C = 128 elements, each S = 4 VDPBF16PS steps. In chunk c, step
//    s and lane l (0..15) take the pair of elements e0 = c + 8·l + s and e1 = e0 + 4, and add, as VDPBF16PS
//    does, first the e1 product and then the e0 product, each added exactly and rounded once to f32 (nearest
//    even; bf16 denormal operands as zero, denormal sums flushed). Lane l's partial sum P starts at +0 in
//    every chunk and runs over the S steps; all its 8 elements lie in one scale block of 16, whose
//    multiplier m gives the lane's accumulator acc_l = fma(P, m, acc_l). Elements at or past k are zeros; a
//    lane all of whose elements are past k leaves acc_l alone. The 16 lanes are added in linear_lanes.hpp's
//    fixed tree.
//  FP4 chunk order (both FP4 formats): k padded to a multiple of 128 with zeros; in each chunk, step s's word
//  2l + h holds element 8·l + 4·h + s, so lane l pairs e0 and e0 + 4 as above. This is what in-register
//  unpacking gives without any interleave: 64 FP4 bytes read as 32 words give the nibbles s = 0..3 of every
//  word by shifts of 4·s; activations are put in the same order once per call.
// Every output depends only on its own row of x and of W, never on m, the column block or the thread count.
#pragma once
#include <cstdint>

#include "kernels/packed_weight.hpp"

namespace xmoe::kernels {

inline constexpr int64_t kFp4Bf16DotChunk = 128;  // C above

namespace reference {
void linear_fp8_block_medium(const LinearArgs& args);
void linear_mxfp4_medium(const LinearArgs& args);
void linear_nvfp4_medium(const LinearArgs& args);
}  // namespace reference
namespace avx512_bf16 {
void linear_fp8_block_medium(const LinearArgs& args);
void linear_mxfp4_medium(const LinearArgs& args);
void linear_nvfp4_medium(const LinearArgs& args);
// The same with wider decode tiles, more weight rows a tile at 1-2 x rows (AMD: see the .cpp); same bits.
void linear_fp8_block_medium_wide_decode(const LinearArgs& args);
void linear_mxfp4_medium_wide_decode(const LinearArgs& args);
void linear_nvfp4_medium_wide_decode(const LinearArgs& args);
}  // namespace avx512_bf16

}  // namespace xmoe::kernels
