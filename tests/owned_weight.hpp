// Test weights in any format: the values quantized or widened as a checkpoint would hold them, owned, with a
// PackedWeight view of them (rows back to back, so gate then up in one allocation is one joinable view).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/packed_weight.hpp"
#include "kernels/quant/quantize.hpp"
#include "xmoe/dtype.hpp"

namespace xmoe::test_weights {

struct OwnedWeight {
  std::vector<float> f32;
  std::vector<uint16_t> bf16;
  kernels::quant::QuantizedMatrix quantized;
  kernels::PackedWeight view;
};

inline std::unique_ptr<OwnedWeight> make_weight(kernels::WeightFormat f, const std::vector<float>& v,
                                                int64_t rows, int64_t cols) {
  using kernels::WeightFormat;
  auto w = std::make_unique<OwnedWeight>();
  if (f == WeightFormat::f32 || f == WeightFormat::bf16) {
    kernels::PackedWeight& p = w->view;
    p.format = f;
    p.rows = rows;
    p.cols = cols;
    if (f == WeightFormat::f32) {
      w->f32 = v;
      p.data = reinterpret_cast<const std::byte*>(w->f32.data());
      p.row_bytes = cols * 4;
    } else {
      for (float x : v) w->bf16.push_back(bf16::from_float(x));
      p.data = reinterpret_cast<const std::byte*>(w->bf16.data());
      p.row_bytes = cols * 2;
    }
    return w;
  }
  if (f == WeightFormat::fp8_block)
    w->quantized = kernels::quant::quantize_fp8_block(v.data(), rows, cols);
  else if (f == WeightFormat::mxfp4)
    w->quantized = kernels::quant::quantize_mxfp4(v.data(), rows, cols);
  else
    w->quantized = kernels::quant::quantize_nvfp4(v.data(), rows, cols);
  w->view = w->quantized.view();
  return w;
}

}  // namespace xmoe::test_weights
