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

void linear_fp4_medium(const LinearArgs& a, WeightFormat format) {
  quant::check_linear_args(a, format);
  const PackedWeight& w = *a.w;
  const int64_t k = w.cols, chunk = kFp4Bf16DotChunk, steps = chunk / 32;
  // Weights and x as bf16 bits, zeros past k.
  const int64_t padded = (k + chunk - 1) / chunk * chunk;
  std::vector<uint16_t> wb(static_cast<size_t>(padded)), xb(static_cast<size_t>(padded));
  std::vector<float> mult(static_cast<size_t>(k));
  for (int64_t n = a.n0; n < a.n1; ++n) {
    // The codes' own values (row_to_f32's decoders without the multiplier) and, apart, the multipliers.
    for (int64_t p = 0; p < k; ++p) {
      const uint8_t byte = static_cast<uint8_t>(w.data[n * w.row_bytes + p / 2]);
      wb[p] = bf16::from_float(quant::e2m1_to_f32(p % 2 == 0 ? byte & 0xF : byte >> 4));  // exact
      mult[p] = quant::block_multiplier(w, n, p);
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

void linear_fp8_block_medium(const LinearArgs& a) {
  quant::check_linear_args(a, WeightFormat::fp8_block);
  const PackedWeight& w = *a.w;
  const int64_t k = w.cols, padded = (k + 63) / 64 * 64;
  // Position q's element: in each block of 64, step s's word 2l + h holds element 4l + 2h + s.
  std::vector<int64_t> element(static_cast<size_t>(padded));
  for (int64_t q = 0; q < padded; ++q) {
    const int64_t r = q % 64, s = r / 32, l = r % 32 / 2, h = r % 2;
    element[q] = q - r + 4 * l + 2 * h + s;
  }
  std::vector<uint16_t> wb(static_cast<size_t>(padded)), xb(wb.size());
  std::vector<float> mult(static_cast<size_t>(k));
  for (int64_t n = a.n0; n < a.n1; ++n) {
    for (int64_t q = 0; q < padded; ++q) {
      const int64_t p = element[q];
      // exact: every E4M3 value × 2^-8 is a normal bf16 (or zero, or NaN)
      wb[q] = p < k ? bf16::from_float(quant::e4m3_to_f32(static_cast<uint8_t>(w.data[n * w.row_bytes + p])) *
                                       0x1p-8f)
                    : 0;
    }
    for (int64_t p = 0; p < k; ++p) mult[p] = quant::block_multiplier(w, n, p) * 0x1p8f;
    for (int64_t i = 0; i < a.m; ++i) {
      for (int64_t q = 0; q < padded; ++q) {
        const int64_t p = element[q];
        xb[q] = p < k ? bf16::from_float(flush_denormal(a.x[i * a.ldx + p] * mult[p])) : 0;
      }
      a.y[i * a.ldy + n] = bf16dot_row(xb.data(), wb.data(), padded / kBf16DotStep);
    }
  }
}
void linear_mxfp4_medium(const LinearArgs& args) {
  linear_fp4_medium(args, WeightFormat::mxfp4);
}
void linear_nvfp4_medium(const LinearArgs& args) {
  linear_fp4_medium(args, WeightFormat::nvfp4);
}

}  // namespace xmoe::kernels::reference
