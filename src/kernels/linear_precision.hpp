// The precision of matrix products over BF16 weights, as torch.set_float32_matmul_precision names it:
//  * highest: f32 arithmetic (weights widened to f32, f32 FMA chains; linear_lanes.hpp's order);
//  * medium: activations rounded to bf16 (nearest even) and multiplied with the bf16 weights in pairs,
//    accumulated in f32 (VDPBF16PS on AVX512-BF16; linear_bf16dot.hpp gives the exact arithmetic).
// Other weight formats (f32, f16, quantized) and attention compute in f32 under either.
#pragma once
#include <string>

namespace xmoe::kernels {

enum class MatmulPrecision { highest, medium };

const char* matmul_precision_name(MatmulPrecision p);  // "highest", "medium"
// Throws xmoe::Error naming the value and the accepted ones.
MatmulPrecision parse_matmul_precision(const std::string& name);

}  // namespace xmoe::kernels
