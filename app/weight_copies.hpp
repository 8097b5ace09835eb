// Distinct copies of one packed weight for the kernel benchmarks, so that decode streams them from DRAM as it
// streams a model's experts. They lie back to back in 2 MiB pages (util/huge_buffer.hpp), as a checkpoint's
// weights are read (io/page_cache.hpp): in 4 KiB pages BF16 decode of the 4096 × 2048 shape streamed at
// 26.4 GB/s where 2 MiB pages gave 35.0-35.6 (2 threads, `linear-bench --matmul-precision medium`).
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/packed_weight.hpp"
#include "util/huge_buffer.hpp"

namespace xmoe::app {

// The kernel benchmarks' matrix shapes (N × K), Qwen3-30B-A3B's.
struct BenchShape {
  const char* what;
  int64_t n, k;
};
inline constexpr BenchShape kBenchShapes[] = {
    {"expert down", 2048, 768}, {"expert gate/up", 768, 2048}, {"attention q", 4096, 2048}};

// One weight matrix in a format (BF16, or quantized as the checkpoint writers quantize), its bytes owned
// here.
struct OwnedWeight {
  std::vector<uint8_t> data, scales;
  kernels::PackedWeight view;
};
// ue8m0: FP8 block scales rounded up to powers of two (DeepSeek-V3.1's scale_fmt).
OwnedWeight make_weight(kernels::WeightFormat f, const std::vector<float>& w, int64_t rows, int64_t cols,
                        bool ue8m0 = false);

struct WeightCopies {
  HugeBuffer memory;
  std::vector<kernels::PackedWeight> views;
  // FP8: each view's NaN-free row flags, as the model loader gives a checkpoint's (its bytes stay as they
  // are).
  std::unique_ptr<std::atomic<uint8_t>[]> nan_free_rows;
};

// How many bytes of copies a benchmark streams so that none is still cached when it comes round again: at
// least `at_least`, and twice the largest CPU cache sysfs reports (a VM may see its host's whole L3: 480 MiB
// here, where 96 MiB of copies were read from L3 at 57 GB/s against a 34 GB/s DRAM probe).
size_t stream_bytes_beyond_caches(size_t at_least);

// `count` copies of w's bytes (its rows · row_bytes data bytes, then its scales), each view w's but for them
// (and, FP8, its flags).
WeightCopies copy_weight(const kernels::PackedWeight& w, size_t count);

}  // namespace xmoe::app
