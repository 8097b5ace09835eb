#include "weight_copies.hpp"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <string>

namespace xmoe::app {

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
  WeightCopies out{allocate_huge_buffer(each * count), std::vector<kernels::PackedWeight>(count, w)};
  for (size_t i = 0; i < count; ++i) {
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
