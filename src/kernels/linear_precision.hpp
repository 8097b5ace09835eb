// The precision of matrix products over BF16 and block-quantized weights, as
// torch.set_float32_matmul_precision names it:
//  * highest: f32 arithmetic (weights widened or dequantised to f32, f32 FMA chains; linear_lanes.hpp's
//    order);
//  * medium: activations rounded to bf16 (nearest even) and multiplied with the weights as bf16 in pairs,
//    accumulated in f32 (VDPBF16PS on AVX512-BF16). BF16 weights as they are (linear_bf16dot.hpp); FP8 /
//    MXFP4 / NVFP4 codes, exact in bf16, with the block scales applied to the activations before rounding
//    (FP8), to the codes (MXFP4, powers of two) or to f32 partial sums (NVFP4) (linear_quant_bf16dot.hpp).
// f32 and f16 weights and attention compute in f32 under either.
#pragma once
#include <string>

namespace xmoe::kernels {

enum class MatmulPrecision { highest, medium };

const char* matmul_precision_name(MatmulPrecision p);  // "highest", "medium"
// Throws xmoe::Error naming the value and the accepted ones.
MatmulPrecision parse_matmul_precision(const std::string& name);

}  // namespace xmoe::kernels
