// The `medium` precision's oracle for block-quantized weights: plain loops over linear_quant_bf16dot.hpp's
// arithmetic, lane by lane, with linear_bf16dot.hpp's emulation of VDPBF16PS. The AVX512-BF16 kernels must
// match it bit for bit; its decode of every code point is PackedWeight::row_to_f32's (PyTorch's), checked
// against the PyTorch fixtures by the tests.
#include <vector>

#include "kernels/cpu/linear_bf16dot.hpp"
#include "kernels/cpu/linear_lanes.hpp"
#include "kernels/cpu/linear_quant.hpp"
#include "kernels/cpu/linear_quant_bf16dot.hpp"
#include "kernels/quant/block_scale.hpp"
#include "xmoe/dtype.hpp"

namespace xmoe::kernels::reference {
namespace {

void linear_medium(const LinearArgs& a, WeightFormat format) {
  quant::check_linear_args(a, format);
  const PackedWeight& w = *a.w;
  const int64_t k = w.cols, chunk = quant_bf16dot_chunk(format), steps = chunk / 32;
  const bool fp8 = format == WeightFormat::fp8_block;
  // Weights and x as bf16 bits, zeros past k.
  const int64_t padded = (k + chunk - 1) / chunk * chunk;
  std::vector<uint16_t> wb(static_cast<size_t>(padded)), xb(static_cast<size_t>(padded));
  std::vector<float> mult(static_cast<size_t>(k));
  for (int64_t n = a.n0; n < a.n1; ++n) {
    // The codes' own values (row_to_f32's decoders without the multiplier) and, apart, the multipliers.
    for (int64_t p = 0; p < k; ++p) {
      float v;
      if (fp8) {
        v = quant::e4m3_to_f32(static_cast<uint8_t>(w.data[n * w.row_bytes + p])) * 0x1p-8f;
      } else {
        const uint8_t byte = static_cast<uint8_t>(w.data[n * w.row_bytes + p / 2]);
        v = quant::e2m1_to_f32(p % 2 == 0 ? byte & 0xF : byte >> 4);
      }
      wb[p] = bf16::from_float(v);  // exact: every such value is a normal bf16 (or zero, or NaN)
      const float q = quant::block_multiplier(w, n, p);
      mult[p] = fp8 ? q * 0x1p8f : q;
    }
    for (int64_t i = 0; i < a.m; ++i) {
      for (int64_t p = 0; p < k; ++p) xb[p] = bf16::from_float(a.x[i * a.ldx + p]);
      float lanes[16] = {};
      for (int64_t c = 0; c < k; c += chunk)
        for (int l = 0; l < 16; ++l) {
          const int64_t first = c + chunk / 16 * l;
          if (first >= k) continue;
          float partial = 0.0f;
          for (int64_t s = 0; s < steps; ++s) {
            const int64_t e0 = first + s, e1 = e0 + chunk / 32;
            partial = dpbf16_lane(partial, xb[e0], xb[e1], wb[e0], wb[e1]);
          }
          lanes[l] = std::fma(partial, mult[first], lanes[l]);
        }
      a.y[i * a.ldy + n] = reduce_lanes(lanes);
    }
  }
}

}  // namespace

void linear_fp8_block_medium(const LinearArgs& args) {
  linear_medium(args, WeightFormat::fp8_block);
}
void linear_mxfp4_medium(const LinearArgs& args) {
  linear_medium(args, WeightFormat::mxfp4);
}
void linear_nvfp4_medium(const LinearArgs& args) {
  linear_medium(args, WeightFormat::nvfp4);
}

}  // namespace xmoe::kernels::reference
