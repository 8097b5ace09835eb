// The `medium` precision's oracle for block-quantized weights: plain loops over linear_quant_bf16dot.hpp's
// arithmetic, lane by lane, with linear_bf16dot.hpp's emulation of VDPBF16PS (and, for FP8 at the AMX level,
// linear_quant_bf16tile.hpp's: the same operands summed as TDPBF16PS does). The AVX512-BF16 kernels must
// match it bit for bit; its decode of every code point is PackedWeight::row_to_f32's (PyTorch's), checked
// against the PyTorch fixtures by the tests.
#include <vector>

#include "kernels/cpu/linear_bf16dot.hpp"
#include "kernels/cpu/linear_bf16tile.hpp"
#include "kernels/cpu/linear_lanes.hpp"
#include "kernels/cpu/linear_quant.hpp"
#include "kernels/cpu/linear_quant_bf16dot.hpp"
#include "kernels/cpu/linear_quant_bf16tile.hpp"
#include "kernels/quant/block_scale.hpp"
#include "xmoe/dtype.hpp"

namespace xmoe::kernels::reference {
namespace {

// Position q's element in chunk order: in each chunk of `chunk` (64 or 128), step s's word 2l + h holds
// element (chunk / 16)·l + (chunk / 32)·h + s.
std::vector<int64_t> chunk_order(int64_t padded, int64_t chunk) {
  std::vector<int64_t> element(static_cast<size_t>(padded));
  for (int64_t q = 0; q < padded; ++q) {
    const int64_t r = q % chunk, s = r / 32, l = r % 32 / 2, h = r % 2;
    element[q] = q - r + chunk / 16 * l + chunk / 32 * h + s;
  }
  return element;
}

}  // namespace

void linear_nvfp4_medium(const LinearArgs& a) {
  quant::check_linear_args(a, WeightFormat::nvfp4);
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

// FP8 block medium's operands (linear_quant_bf16dot.hpp) in chunk order, each output summed by `row`.
template <class Row>
void fp8_block_medium_rows(const LinearArgs& a, const Row& row) {
  static_assert(kBf16DotStep == kBf16TileStep, "both arithmetics take steps of 32 in chunk order");
  quant::check_linear_args(a, WeightFormat::fp8_block);
  const PackedWeight& w = *a.w;
  const int64_t k = w.cols, padded = (k + 63) / 64 * 64;
  const std::vector<int64_t> element = chunk_order(padded, 64);
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
      a.y[i * a.ldy + n] = row(xb.data(), wb.data(), padded / kBf16DotStep);
    }
  }
}

void linear_fp8_block_medium(const LinearArgs& a) {
  fp8_block_medium_rows(a, bf16dot_row);
}
void linear_fp8_block_medium_tile(const LinearArgs& a) {
  fp8_block_medium_rows(a, bf16tile_row);
}

// MXFP4 medium's operands (linear_quant_bf16dot.hpp) in FP4 chunk order, each output summed by `row`.
template <class Row>
void mxfp4_medium_rows(const LinearArgs& a, const Row& row) {
  quant::check_linear_args(a, WeightFormat::mxfp4);
  const PackedWeight& w = *a.w;
  const int64_t k = w.cols, padded = (k + kFp4Bf16DotChunk - 1) / kFp4Bf16DotChunk * kFp4Bf16DotChunk;
  const std::vector<int64_t> element = chunk_order(padded, kFp4Bf16DotChunk);
  std::vector<uint16_t> wb(static_cast<size_t>(padded)), xb(wb.size());
  for (int64_t n = a.n0; n < a.n1; ++n) {
    for (int64_t q = 0; q < padded; ++q) {
      const int64_t p = element[q];
      if (p >= k) {
        wb[q] = 0;
        continue;
      }
      const uint8_t byte = static_cast<uint8_t>(w.data[n * w.row_bytes + p / 2]);
      // exact for scale codes 2..252: an E2M1 value times a power of two in bf16's normal range
      wb[q] = bf16::from_float(quant::e2m1_to_f32(p % 2 == 0 ? byte & 0xF : byte >> 4) *
                               quant::block_multiplier(w, n, p));
    }
    for (int64_t i = 0; i < a.m; ++i) {
      for (int64_t q = 0; q < padded; ++q) {
        const int64_t p = element[q];
        xb[q] = p < k ? bf16::from_float(a.x[i * a.ldx + p]) : 0;
      }
      a.y[i * a.ldy + n] = row(xb.data(), wb.data(), padded / kBf16DotStep);
    }
  }
}

void linear_mxfp4_medium(const LinearArgs& a) {
  mxfp4_medium_rows(a, bf16dot_row);
}
void linear_mxfp4_medium_tile(const LinearArgs& a) {
  mxfp4_medium_rows(a, bf16tile_row);
}

}  // namespace xmoe::kernels::reference
