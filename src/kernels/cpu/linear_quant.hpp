// Linear layers over block-quantized weights (FP8 block, MXFP4, NVFP4): y[i, n] = Σ_k x[i, k] · W[n, k], with
// LinearArgs' contract (kernels/packed_weight.hpp). The summation order every variant shares, so the AVX2 and
// AVX-512 variants return the reference's results bit for bit:
//  * the weight is decoded to f32 with its block scale folded in, one f32 product per element:
//    w[n, k] = decode(q[n, k]) · multiplier(n, k) — exactly PackedWeight::row_to_f32, i.e. PyTorch's
//    dequantisation (the multiplier is NVFP4's e4m3(weight_scale) · weight_scale_2 as one f32 product);
//  * then the f32/bf16 linears' order (linear_lanes.hpp): lane l (0..15) takes the products x[i, k] · w[n, k]
//    with k ≡ l (mod 16) in ascending k as one FMA chain, and the lanes are added by reduce_lanes' fixed
//    tree.
// So a quantized linear equals the f32 linear over the dequantised weight. Each entry picks its own
// blocking by m: up to 3 rows decode in registers, block by block, while the weight streams once; batches
// (AVX2: up to 16 rows; AVX-512: FP4 16, FP8 8) run the same decode over slices of weight rows, one group of
// x rows after another; more rows dequantise a panel of weight rows once into f32 and run a register-blocked
// FMA micro-kernel over it in k chunks, carrying the accumulators from chunk to chunk (so chunking changes no
// bit).
#pragma once
#include "kernels/packed_weight.hpp"

namespace xmoe::kernels {

namespace reference {
void linear_fp8_block(const LinearArgs& args);
void linear_mxfp4(const LinearArgs& args);
void linear_nvfp4(const LinearArgs& args);
}  // namespace reference
namespace avx2 {
void linear_fp8_block(const LinearArgs& args);
void linear_mxfp4(const LinearArgs& args);
void linear_nvfp4(const LinearArgs& args);
}  // namespace avx2
namespace avx512 {
void linear_fp8_block(const LinearArgs& args);
void linear_mxfp4(const LinearArgs& args);
void linear_nvfp4(const LinearArgs& args);
}  // namespace avx512

namespace quant {
// Checks the arguments every variant relies on (format, scale geometry, ranges); throws xmoe::Error naming
// the field.
void check_linear_args(const LinearArgs& args, WeightFormat format);
// args restricted to x rows [i0, i0 + rows) and columns [n, n + cols).
inline LinearArgs args_part(const LinearArgs& args, int64_t i0, int64_t rows, int64_t n, int64_t cols) {
  LinearArgs part = args;
  part.x = args.x + i0 * args.ldx;
  part.m = rows;
  part.y = args.y + i0 * args.ldy;
  part.n0 = n;
  part.n1 = n + cols;
  return part;
}
// `reference` over rows [i0, i0 + rows) and columns [n, n + cols) of args: how the fast kernels compute a
// tile that met a code their decode leaves out.
void reference_part(const LinearArgs& args, LinearFn reference, int64_t i0, int64_t rows, int64_t n,
                    int64_t cols);
// table[c] = the block multiplier of scale code c (E8M0 / E4M3; times the global scale for NVFP4), exactly as
// quant::block_multiplier computes it. Defined in a baseline-ISA file so the vector files need no inline
// scalar decoders of their own (an inline function compiled with AVX-512 flags could be the copy the linker
// keeps for every caller).
void fill_scale_table(const PackedWeight& w, float table[256]);
// What the vector levels' FP8 decodes may do for the call `a`, from one pass over the block multipliers of
// its rows [a.n0, a.n1) (and, at one x row, over x):
struct Fp8DecodeForms {
  // The codes decoded by integer operations as f32 values × 2^-120 (normals and subnormals alike) with 2^120
  // folded into each block multiplier: every multiplier is below 2^8 (so s · 2^120 is exact) and MXCSR does
  // not treat subnormal inputs as zero (DAZ), so the product of such a value and the folded multiplier is the
  // same real number as the reference's product and rounds to the same f32.
  bool integer_decode = false;
  // One x row, and the integer decode may multiply x instead of the weights: every multiplier is a power of
  // two in [2^-100, 2^7] (DeepSeek-V3.1's ue8m0 scales: then v · s is exact for every E4M3 value v) and
  // every nonzero x value times every multiplier · 2^120 stays in f32's normal range (a NaN or infinite x
  // fails).
  bool scaled_x = false;
};
Fp8DecodeForms fp8_decode_forms(const LinearArgs& a);
}  // namespace quant

}  // namespace xmoe::kernels
