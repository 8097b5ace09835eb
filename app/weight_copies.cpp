#include "weight_copies.hpp"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <string>

#include "kernels/quant/quantize.hpp"
#include "xmoe/dtype.hpp"

namespace xmoe::app {

OwnedWeight make_weight(kernels::WeightFormat f, const std::vector<float>& w, int64_t rows, int64_t cols,
                        bool ue8m0) {
  OwnedWeight o;
  if (f == kernels::WeightFormat::bf16) {
    o.data.resize(static_cast<size_t>(rows * cols) * 2);
    for (int64_t i = 0; i < rows * cols; ++i) {
      const uint16_t b = bf16::from_float(w[i]);
      std::memcpy(o.data.data() + 2 * i, &b, 2);
    }
    o.view.format = f;
    o.view.rows = rows;
    o.view.cols = cols;
    o.view.row_bytes = cols * 2;
  } else {
    kernels::quant::QuantizedMatrix q = f == kernels::WeightFormat::fp8_block
                                            ? kernels::quant::quantize_fp8_block(w.data(), rows, cols, ue8m0)
                                        : f == kernels::WeightFormat::mxfp4
                                            ? kernels::quant::quantize_mxfp4(w.data(), rows, cols)
                                            : kernels::quant::quantize_nvfp4(w.data(), rows, cols);
    o.view = q.view();
    o.data = std::move(q.data);
    o.scales = std::move(q.scales);
  }
  o.view.data = reinterpret_cast<const std::byte*>(o.data.data());
  o.view.scales = o.scales.empty() ? nullptr : reinterpret_cast<const std::byte*>(o.scales.data());
  return o;
}

size_t stream_bytes_beyond_caches(size_t at_least) {
  size_t largest = 0;
  for (int index = 0; index < 8; ++index) {
    std::ifstream in("/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/size");
    size_t size = 0;
    if (!(in >> size)) continue;
    const int unit = in.peek();  // sysfs writes "491520K"
    if (unit == 'K') size <<= 10;
    if (unit == 'M') size <<= 20;
    largest = std::max(largest, size);
  }
  return std::max(at_least, 2 * largest);
}

WeightCopies copy_weight(const kernels::PackedWeight& w, size_t count) {
  const auto padded = [](size_t bytes) { return (bytes + 63) / 64 * 64; };
  const auto data_bytes = static_cast<size_t>(w.rows * w.row_bytes);
  const size_t scale_bytes = w.scales != nullptr ? w.bytes() - data_bytes : 0;
  const size_t each = padded(data_bytes) + padded(scale_bytes);
  WeightCopies out{allocate_huge_buffer(each * count), std::vector<kernels::PackedWeight>(count, w), nullptr};
  if (w.format == kernels::WeightFormat::fp8_block)
    out.nan_free_rows = std::make_unique<std::atomic<uint8_t>[]>(count * static_cast<size_t>(w.rows));
  for (size_t i = 0; i < count; ++i) {
    if (out.nan_free_rows) out.views[i].nan_free_rows = out.nan_free_rows.get() + i * w.rows;
    std::byte* data = out.memory.get() + i * each;
    std::memcpy(data, w.data, data_bytes);
    out.views[i].data = data;
    if (scale_bytes != 0) {
      std::memcpy(data + padded(data_bytes), w.scales, scale_bytes);
      out.views[i].scales = data + padded(data_bytes);
    }
  }
  return out;
}

}  // namespace xmoe::app
