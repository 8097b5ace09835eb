// linear_forward_parts (q/k/v or gate/up stored apart, in one parallel region) against the oracle it
// replaces: one kernels::linear_forward per part into its columns of the shared output, bit for bit, for
// every weight format, every kernel level on this CPU, 1, 2 and 3 threads, 1, 5 and 16 rows, and part sizes
// that are not multiples of the 8-column split unit (so a thread's range starts inside a part).
#include <gtest/gtest.h>
#include <omp.h>

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu_features.hpp"
#include "kernels/kernels.hpp"
#include "kernels/linear.hpp"
#include "kernels/quant/quantize.hpp"
#include "llm/layers/linear_parts.hpp"
#include "owned_weight.hpp"
#include "xmoe/dtype.hpp"
#include "xmoe/error.hpp"

namespace xmoe::llm {
namespace {

using kernels::PackedWeight;
using kernels::WeightFormat;

using test_weights::make_weight;
using test_weights::OwnedWeight;

std::vector<float> random_values(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

std::vector<kernels::Isa> levels() {
  const kernels::CpuFeatures f = kernels::detect_cpu_features();
  std::vector<kernels::Isa> out;
  for (const kernels::Isa isa :
       {kernels::Isa::reference, kernels::Isa::avx2, kernels::Isa::avx512, kernels::Isa::avx512_bf16})
    if (kernels::isa_supported(f, isa)) out.push_back(isa);
  return out;
}

TEST(LinearParts, EqualsOneLinearPerPartBitForBit) {
  // Columns 128 (a block of every format); parts of 44, 20 and 100 rows: 22 units of 8 that split inside
  // the first and the last part for 2 and 3 threads. At 16 rows the product is big enough
  // (m · rows · cols ≥ 2^16 multiply-adds per thread) that the team really runs.
  constexpr int64_t kCols = 128;
  const int64_t part_rows[] = {44, 20, 100};
  int64_t total = 0;
  for (int64_t r : part_rows) total += r;
  const int saved = omp_get_max_threads();
  for (const WeightFormat f : {WeightFormat::f32, WeightFormat::bf16, WeightFormat::fp8_block,
                               WeightFormat::mxfp4, WeightFormat::nvfp4}) {
    std::mt19937 rng(11);
    std::vector<std::unique_ptr<OwnedWeight>> owned;
    std::vector<PackedWeight> parts;
    for (int64_t r : part_rows) {
      owned.push_back(make_weight(f, random_values(static_cast<size_t>(r * kCols), rng), r, kCols));
      parts.push_back(owned.back()->view);
    }
    for (const kernels::Isa isa : levels())
      for (const int64_t m : {1, 5, 16}) {
        const kernels::KernelTable& t = kernels::kernel_table(isa, kernels::detect_cpu_features());
        const std::vector<float> x = random_values(static_cast<size_t>(m * (kCols + 3)), rng);
        const int64_t ldy = total + 5;  // padding columns stay untouched
        std::vector<float> want(static_cast<size_t>(m * ldy), -7.0f);
        omp_set_num_threads(1);
        int64_t col = 0;
        for (const PackedWeight& w : parts) {
          kernels::linear_forward(t, w, x.data(), m, kCols + 3, want.data() + col, ldy);
          col += w.rows;
        }
        for (int threads : {1, 2, 3}) {
          omp_set_num_threads(threads);
          std::vector<float> got(static_cast<size_t>(m * ldy), -7.0f);
          linear_forward_parts(t, parts, x.data(), m, kCols + 3, got.data(), ldy);
          int bad = 0;
          for (size_t i = 0; i < got.size(); ++i) bad += std::memcmp(&got[i], &want[i], sizeof(float)) != 0;
          EXPECT_EQ(bad, 0) << kernels::weight_format_name(f) << " " << kernels::isa_name(isa) << ", m " << m
                            << ", " << threads << " threads";
        }
      }
  }
  omp_set_num_threads(saved);
}

TEST(LinearParts, PartsWithDifferentColumnsAreRefused) {
  std::mt19937 rng(3);
  auto a = make_weight(WeightFormat::f32, random_values(64, rng), 8, 8);
  auto b = make_weight(WeightFormat::f32, random_values(64, rng), 4, 16);
  const PackedWeight parts[] = {a->view, b->view};
  std::vector<float> x(16), y(12);
  EXPECT_THROW(linear_forward_parts(kernels::best_kernel_table(kernels::detect_cpu_features()), parts,
                                    x.data(), 1, 16, y.data(), 12),
               Error);
}

}  // namespace
}  // namespace xmoe::llm
