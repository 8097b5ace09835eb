// The `medium` matmul precision over block-quantized weights (kernels/cpu/linear_quant_bf16dot.hpp):
//  * the scalar reference against exact arithmetic: on weights and activations whose products and sums are
//    all exact in f32 (small dyadic values, power-of-two scales), it must return the exact dot product of x
//    with the PyTorch-checked dequantisation (row_to_f32), which catches any element paired with the wrong
//    scale or lost; on random data it stays within bf16 rounding of the f32 product;
//  * the AVX512-BF16 kernels against that reference bit for bit, and the AMX level's FP8 kernel against its
//    own reference (linear_quant_bf16tile.hpp: the same operands in TDPBF16PS's order): decode and prefill
//    row counts, column sub-ranges, k tails, every E4M3 code point (subnormals, zeros, NaN), NaN and zero
//    scales, a large NVFP4 global scale and denormals-are-zero (their fallbacks);
//  * each output independent of the rest of its batch: every row of a batch equals that row computed alone,
//    across the switch from register decode to decoded weight panels (the row counts either side of it) and
//    past one L2 block of x rows, and for any thread count of the column split.
#include <gtest/gtest.h>
#include <omp.h>
#include <xmmintrin.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "fp8_nan_flags_check.hpp"
#include "kernels/cpu/linear_quant_bf16dot.hpp"
#include "kernels/cpu/linear_quant_bf16dot_panel_avx512_bf16.hpp"
#include "kernels/cpu/linear_quant_bf16tile.hpp"
#include "kernels/kernels.hpp"
#include "kernels/linear.hpp"
#include "kernels/quant/codecs.hpp"
#include "kernels/quant/quantize.hpp"
#include "quant_fixture.hpp"

namespace xmoe::kernels::quant {
namespace {

std::vector<float> random_values(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

QuantizedMatrix quantize(WeightFormat f, const std::vector<float>& w, int64_t rows, int64_t cols) {
  if (f == WeightFormat::fp8_block) return quantize_fp8_block(w.data(), rows, cols);
  if (f == WeightFormat::mxfp4) return quantize_mxfp4(w.data(), rows, cols);
  return quantize_nvfp4(w.data(), rows, cols);
}

const KernelTable& medium_reference() {
  return kernel_table(Isa::reference, detect_cpu_features(), MatmulPrecision::medium);
}

// A vector level's medium kernel for one format and the scalar reference it must match bit for bit.
struct FastKernel {
  std::string level;
  Isa isa;
  LinearFn kernel, reference;
  std::vector<int64_t> switch_rows;  // row counts each side of its decode / prefill switch
  int64_t prefill_rows;              // a batch of the prefill shape, its tiles of two heights
};

// Row counts each side of the AVX512-BF16 kernels' switch to decoded panels (a tile of fewer rows is the only
// tile at the threshold, one more row makes tiles of two heights) and one that needs two L2 blocks of x rows
// at k = 2048.
std::vector<int64_t> panel_row_counts(WeightFormat f) {
  const int64_t t = f == WeightFormat::fp8_block ? avx512_bf16::kQuantPanelMinRowsFp8
                    : f == WeightFormat::mxfp4   ? avx512_bf16::kQuantPanelMinRowsMxfp4
                                                 : avx512_bf16::kQuantPanelMinRowsNvfp4;
  return {t - 1, t, t + 1, 130};
}

// The AVX512-BF16 kernel for format f with the decode tiles the table takes on Intel CPUs (wide: on AMD).
LinearFn avx512_bf16_kernel(WeightFormat f, bool wide) {
  if (f == WeightFormat::fp8_block)
    return wide ? avx512_bf16::linear_fp8_block_medium_wide_decode : avx512_bf16::linear_fp8_block_medium;
  if (f == WeightFormat::mxfp4)
    return wide ? avx512_bf16::linear_mxfp4_medium_wide_decode : avx512_bf16::linear_mxfp4_medium;
  return wide ? avx512_bf16::linear_nvfp4_medium_wide_decode : avx512_bf16::linear_nvfp4_medium;
}

// The kernels for format f of every vector level this CPU has, each once (the AMX level keeps the
// AVX512-BF16 kernel of NVFP4), the AVX512-BF16 level's in both its forms (decode tiles by vendor, the one
// this CPU's table takes first); empty where it has no AVX512-BF16.
std::vector<FastKernel> fast_kernels(WeightFormat f) {
  const CpuFeatures features = detect_cpu_features();
  std::vector<FastKernel> out;
  if (!isa_supported(features, Isa::avx512_bf16)) return out;
  const auto slot = static_cast<size_t>(f);
  for (const bool wide : {features.amd, !features.amd})
    out.push_back({wide ? "avx512_bf16 wide decode" : "avx512_bf16", Isa::avx512_bf16,
                   avx512_bf16_kernel(f, wide), medium_reference().linear[slot], panel_row_counts(f),
                   panel_row_counts(f)[2]});
  if (isa_supported(features, Isa::amx) && f != WeightFormat::nvfp4) {
    const bool fp8 = f == WeightFormat::fp8_block;
    const int64_t t = fp8 ? amx::kFp8TileDecodeRows : amx::kMxfp4TileDecodeRows;
    out.push_back({"amx",
                   Isa::amx,
                   kernel_table(Isa::amx, features, MatmulPrecision::medium).linear[slot],
                   fp8 ? reference::linear_fp8_block_medium_tile : reference::linear_mxfp4_medium_tile,
                   {t, t + 1, 2 * t + 1, 130},
                   2 * t + 1});
  }
  return out;
}

// The AVX512-BF16 medium table, or null where this CPU lacks the instruction.
const KernelTable* medium_fast() {
  const CpuFeatures f = detect_cpu_features();
  if (!isa_supported(f, Isa::avx512_bf16)) return nullptr;
  return &kernel_table(Isa::avx512_bf16, f, MatmulPrecision::medium);
}

std::vector<float> run(LinearFn linear, const PackedWeight& w, const std::vector<float>& x, int64_t m,
                       int64_t ldx, int64_t n0, int64_t n1, int64_t ldy) {
  std::vector<float> y(static_cast<size_t>(m * ldy), 12345.0f);  // untouched outside [n0, n1)
  linear(LinearArgs{x.data(), m, ldx, &w, n0, n1, y.data(), ldy});
  return y;
}
std::vector<float> run(const KernelTable& t, const PackedWeight& w, const std::vector<float>& x, int64_t m,
                       int64_t ldx, int64_t n0, int64_t n1, int64_t ldy) {
  return run(t.linear[static_cast<int>(w.format)], w, x, m, ldx, n0, n1, ldy);
}

void expect_same(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (!test::same_float(got[i], want[i]) && ++bad < 5)
      ADD_FAILURE() << what << " at " << i << ": " << got[i] << " vs reference " << want[i];
  EXPECT_EQ(bad, 0) << what;
}

TEST(QuantMedium, TableHasMediumQuantLinears) {
  const KernelTable& r = medium_reference();
  EXPECT_EQ(r.precision, MatmulPrecision::medium);
  for (const WeightFormat f : {WeightFormat::fp8_block, WeightFormat::mxfp4, WeightFormat::nvfp4}) {
    EXPECT_NE(r.linear[static_cast<int>(f)], reference_kernel_table().linear[static_cast<int>(f)]);
    for (const FastKernel& fast : fast_kernels(f)) EXPECT_NE(fast.kernel, fast.reference) << fast.level;
  }
  const CpuFeatures features = detect_cpu_features();
  if (isa_supported(features, Isa::amx)) {  // on tiles: another arithmetic than the AVX512-BF16 level's
    for (const WeightFormat f : {WeightFormat::fp8_block, WeightFormat::mxfp4}) {
      const std::vector<FastKernel> kernels = fast_kernels(f);
      ASSERT_EQ(kernels.size(), 3u);
      EXPECT_NE(kernels[2].kernel, kernels[0].kernel) << weight_format_name(f);
      EXPECT_NE(kernels[2].kernel, kernels[1].kernel) << weight_format_name(f);
    }
    EXPECT_EQ(kernel_table(Isa::amx, features, MatmulPrecision::medium).linear[int(WeightFormat::nvfp4)],
              avx512_bf16::linear_nvfp4_medium);
  }
}

// The AVX512-BF16 medium table takes the wide decode tiles on AMD and the others elsewhere.
TEST(QuantMedium, TableTakesTheDecodeTilesOfTheCpusVendor) {
  CpuFeatures features = detect_cpu_features();
  if (!isa_supported(features, Isa::avx512_bf16)) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  for (const bool amd : {false, true}) {
    features.amd = amd;
    const KernelTable& t = kernel_table(Isa::avx512_bf16, features, MatmulPrecision::medium);
    for (const WeightFormat f : {WeightFormat::fp8_block, WeightFormat::mxfp4, WeightFormat::nvfp4})
      EXPECT_EQ(t.linear[static_cast<size_t>(f)], avx512_bf16_kernel(f, amd))
          << weight_format_name(f) << (amd ? " on AMD" : " elsewhere");
  }
}

// Exact cases: weights quantized from values their format holds exactly, scales powers of two (E8M0, or the
// f32 / E4M3 multipliers forced to 2^j), x in multiples of 1/8 below 4: every product and partial sum is a
// small dyadic number, so the reference must give Σ x · row_to_f32 computed in double, whatever its order.
TEST(QuantMedium, ReferenceIsExactOnExactlyRepresentableData) {
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> pick(0, 15), eighths(-31, 31), power(-3, 3);
  for (const WeightFormat f : {WeightFormat::fp8_block, WeightFormat::mxfp4, WeightFormat::nvfp4}) {
    const int64_t n = 11, k = f == WeightFormat::fp8_block ? 300 : 320;
    std::vector<float> wv(static_cast<size_t>(n * k));
    for (auto& v : wv)
      v = kE2M1Values[static_cast<size_t>(pick(rng))] * (f == WeightFormat::fp8_block ? 4 : 1);
    QuantizedMatrix q = quantize(f, wv, n, k);
    if (f == WeightFormat::fp8_block) {
      for (size_t i = 0; i + 4 <= q.scales.size(); i += 4) {
        const float s = std::ldexp(1.0f, power(rng));
        std::memcpy(q.scales.data() + i, &s, 4);
      }
    } else if (f == WeightFormat::nvfp4) {
      for (auto& c : q.scales) c = f32_to_e4m3(std::ldexp(1.0f, power(rng)));
      q.global_scale = 0.5f;
    }
    const PackedWeight w = q.view();
    const LinearFn tile = f == WeightFormat::fp8_block ? reference::linear_fp8_block_medium_tile
                          : f == WeightFormat::mxfp4   ? reference::linear_mxfp4_medium_tile
                                                       : nullptr;
    for (const int64_t m : {1, 3, 4, 5}) {  // 4, 5: the tile reference (the AMX level's order)
      if (m > 3 && tile == nullptr) continue;
      const LinearFn linear = m > 3 ? tile : medium_reference().linear[static_cast<int>(f)];
      std::vector<float> x(static_cast<size_t>(m * k));
      for (auto& v : x) v = static_cast<float>(eighths(rng)) / 8.0f;
      const auto got = run(linear, w, x, m, k, 0, n, n);
      std::vector<float> row(static_cast<size_t>(k));
      int nonzero = 0;
      for (int64_t j = 0; j < n; ++j) {
        w.row_to_f32(j, row.data());
        for (int64_t i = 0; i < m; ++i) {
          double exact = 0;
          for (int64_t p = 0; p < k; ++p) exact += double(x[i * k + p]) * double(row[p]);
          nonzero += exact != 0;
          EXPECT_EQ(double(got[i * n + j]), exact) << weight_format_name(f) << " row " << j << " x row " << i;
        }
      }
      EXPECT_GT(nonzero, 0);
    }
  }
}

// On random data medium differs from the f32 product only by rounding x to bf16 (relative 2^-9 per element)
// and f32 sums: within 2^-8 of Σ |x · w|.
TEST(QuantMedium, ReferenceIsCloseToHighest) {
  std::mt19937 rng(5);
  for (const WeightFormat f : {WeightFormat::fp8_block, WeightFormat::mxfp4, WeightFormat::nvfp4}) {
    const int64_t n = 7, k = 512, m = 2;
    const QuantizedMatrix q = quantize(f, random_values(static_cast<size_t>(n * k), rng, 0.05f), n, k);
    const PackedWeight w = q.view();
    const auto x = random_values(static_cast<size_t>(m * k), rng);
    const auto medium = run(medium_reference(), w, x, m, k, 0, n, n);
    const auto highest = run(reference_kernel_table(), w, x, m, k, 0, n, n);
    // the tile references: the same operands summed in another order
    const auto tile =
        f == WeightFormat::fp8_block ? run(reference::linear_fp8_block_medium_tile, w, x, m, k, 0, n, n)
        : f == WeightFormat::mxfp4   ? run(reference::linear_mxfp4_medium_tile, w, x, m, k, 0, n, n)
                                     : medium;
    std::vector<float> row(static_cast<size_t>(k));
    for (int64_t j = 0; j < n; ++j) {
      w.row_to_f32(j, row.data());
      for (int64_t i = 0; i < m; ++i) {
        double magnitude = 0;
        for (int64_t p = 0; p < k; ++p) magnitude += std::fabs(double(x[i * k + p]) * row[p]);
        EXPECT_NEAR(medium[i * n + j], highest[i * n + j], magnitude * 0x1p-8) << weight_format_name(f);
        EXPECT_NE(medium[i * n + j], highest[i * n + j]);  // it is another arithmetic
        EXPECT_NEAR(tile[i * n + j], medium[i * n + j], magnitude * 0x1p-20) << weight_format_name(f);
      }
    }
  }
}

struct Shape {
  int64_t n, k;
};

void check_format(WeightFormat f, const std::vector<Shape>& shapes, const FastKernel& fast) {
  std::mt19937 rng(7);
  for (const Shape s : shapes) {
    const QuantizedMatrix q =
        quantize(f, random_values(static_cast<size_t>(s.n * s.k), rng, 0.05f), s.n, s.k);
    const PackedWeight w = q.view();
    std::vector<int64_t> row_counts = {1, 2, 3, 5, 6, 7, 8};
    for (const int64_t m : fast.switch_rows)
      if (s.n * m * s.k <= 3'000'000) row_counts.push_back(m);  // the scalar reference is slow
    for (const int64_t m : row_counts) {
      const int64_t ldx = s.k + 3, ldy = s.n + 2;
      const auto x = random_values(static_cast<size_t>(m * ldx), rng);
      for (const auto& [n0, n1] : {std::pair<int64_t, int64_t>{0, s.n}, {s.n / 3, s.n - s.n / 4}}) {
        if (n0 >= n1) continue;
        const auto want = run(fast.reference, w, x, m, ldx, n0, n1, ldy);
        const std::string what = fast.level + " " + weight_format_name(f) + " n=" + std::to_string(s.n) +
                                 " k=" + std::to_string(s.k) + " m=" + std::to_string(m) + " cols [" +
                                 std::to_string(n0) + ", " + std::to_string(n1) + ")";
        expect_same(run(fast.kernel, w, x, m, ldx, n0, n1, ldy), want, what);
        if (m > 1)  // each row alone gets the bits it gets inside the batch
          for (int64_t i = 0; i < m; i += std::max<int64_t>(1, m / 9)) {
            const std::vector<float> x_row(x.begin() + i * ldx, x.begin() + (i + 1) * ldx);
            const std::vector<float> in_batch(want.begin() + i * ldy, want.begin() + (i + 1) * ldy);
            expect_same(run(fast.kernel, w, x_row, 1, ldx, n0, n1, ldy), in_batch,
                        what + " row " + std::to_string(i) + " alone");
          }
      }
    }
  }
}

void check_format(WeightFormat f, const std::vector<Shape>& shapes) {
  const std::vector<FastKernel> kernels = fast_kernels(f);
  if (kernels.empty()) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  for (const FastKernel& fast : kernels) check_format(f, shapes, fast);
}

TEST(QuantMedium, Fp8BlockKernelMatchesReferenceBitForBit) {
  check_format(WeightFormat::fp8_block, {{1, 16}, {9, 40}, {37, 136}, {130, 300}, {20, 1029}, {6, 2048}});
}
TEST(QuantMedium, Mxfp4KernelMatchesReferenceBitForBit) {
  check_format(WeightFormat::mxfp4, {{1, 32}, {9, 96}, {37, 160}, {130, 320}, {20, 1024}, {6, 2048}});
}
TEST(QuantMedium, Nvfp4KernelMatchesReferenceBitForBit) {
  check_format(WeightFormat::nvfp4, {{1, 16}, {9, 48}, {37, 80}, {130, 304}, {20, 1040}, {6, 2048}});
}

// The AVX512-BF16 FP8 decode tiles (both forms; up to 3 x rows here) record the rows they found free of NaN
// codes in the view's flags and leave the check out on them later (test::expect_nan_free_row_flags).
TEST(QuantMedium, Fp8NanFreeRowFlags) {
  if (!isa_supported(detect_cpu_features(), Isa::avx512_bf16)) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  for (const bool wide : {false, true})
    for (const int64_t m : {1, 2, 3})
      test::expect_nan_free_row_flags(avx512_bf16_kernel(WeightFormat::fp8_block, wide),
                                      reference::linear_fp8_block_medium, false, m,
                                      std::string(wide ? "wide" : "narrow") + " m=" + std::to_string(m));
}

// Its decoded panels flag the clean rows too: whole groups (fp8_decode_rows) and groups decoded between the
// tiles' steps (Fp8PanelRows), at the thresholds' row counts and a long prefill's.
TEST(QuantMedium, Fp8PanelsFlagCleanRows) {
  if (!isa_supported(detect_cpu_features(), Isa::avx512_bf16)) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  for (const int64_t m : panel_row_counts(WeightFormat::fp8_block))
    if (m >= avx512_bf16::kQuantPanelMinRowsFp8)
      test::expect_panels_flag_clean_rows(avx512_bf16::linear_fp8_block_medium,
                                          reference::linear_fp8_block_medium, m, "m=" + std::to_string(m));
}

// Every E4M3 code point as an element (subnormals, both zeros, NaN in its own row), FP8 blocks of 16 columns
// (multipliers differing inside a chunk), E8M0 FP8 scales. 40 rows make the AVX512-BF16 kernel decode the
// next group of weight rows between the steps of the current group's tiles (the NaN row's group included).
TEST(QuantMedium, Fp8EveryCodePointAndBlockShape) {
  const std::vector<FastKernel> kernels = fast_kernels(WeightFormat::fp8_block);
  if (kernels.empty()) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  for (const FastKernel& fast : kernels) {
    std::mt19937 rng(9);
    const int64_t n = 9, k = 264;
    for (const int block : {16, 128}) {
      auto q = quantize_fp8_block(random_values(static_cast<size_t>(n * k), rng).data(), n, k, false, block);
      for (int64_t i = 0; i < (n - 1) * k; ++i) {
        const auto code = static_cast<uint8_t>(i % 256);
        q.data[static_cast<size_t>(i)] = (code & 0x7F) == 0x7F ? 0x3C : code;
      }
      q.data[static_cast<size_t>((n - 1) * k + 100)] = 0xFF;  // the last row only
      const PackedWeight w = q.view();
      for (const int64_t m : {int64_t{1}, int64_t{2}, int64_t{5}, fast.prefill_rows, int64_t{40}}) {
        const auto x = random_values(static_cast<size_t>(m * k), rng);
        const auto want = run(fast.reference, w, x, m, k, 0, n, n);
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < n; ++j)
            EXPECT_EQ(std::isnan(want[i * n + j]), j == n - 1) << i << ", " << j;
        expect_same(
            run(fast.kernel, w, x, m, k, 0, n, n), want,
            fast.level + " fp8 code points, block " + std::to_string(block) + " m=" + std::to_string(m));
      }
    }
    // E8M0 scale codes (ScaleType::e8m0: 2^(c - 127) per 128 × 128 block).
    auto e8 = quantize_fp8_block(random_values(static_cast<size_t>(n * k), rng).data(), n, k);
    e8.scale_type = ScaleType::e8m0;
    std::vector<uint8_t> codes(e8.scales.size() / 4);
    for (size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<uint8_t>(120 + 3 * i);
    e8.scales = codes;
    const PackedWeight w = e8.view();
    for (const int64_t m : {int64_t{2}, fast.prefill_rows}) {
      const auto x = random_values(static_cast<size_t>(m * k), rng);
      expect_same(run(fast.kernel, w, x, m, k, 0, n, n), run(fast.reference, w, x, m, k, 0, n, n),
                  fast.level + " fp8 e8m0");
    }
  }
}

// Blocks of 256 rows: more than one piece of the AMX prefill shape (128 rows decoded at a time) and of the
// rows a decode-shape call scales x for once.
TEST(QuantMedium, Fp8BlocksTallerThanADecodedPiece) {
  const std::vector<FastKernel> kernels = fast_kernels(WeightFormat::fp8_block);
  if (kernels.empty()) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  for (const FastKernel& fast : kernels) {
    std::mt19937 rng(11);
    const int64_t n = 300, k = 200;
    const auto q =
        quantize_fp8_block(random_values(static_cast<size_t>(n * k), rng).data(), n, k, false, 256);
    const PackedWeight w = q.view();
    for (const int64_t m : {int64_t{1}, int64_t{3}, fast.prefill_rows}) {
      const auto x = random_values(static_cast<size_t>(m * k), rng);
      for (const auto& [n0, n1] : {std::pair<int64_t, int64_t>{0, n}, {40, 290}})
        expect_same(
            run(fast.kernel, w, x, m, k, n0, n1, n), run(fast.reference, w, x, m, k, n0, n1, n),
            fast.level + " fp8 256-row blocks m=" + std::to_string(m) + " from " + std::to_string(n0));
    }
  }
}

// An infinite FP8 block multiplier over the k tail: the reference leaves the lanes wholly past k alone, so
// with positive products in every live lane each output is +inf; a lane past k that took 0 · inf would make
// it NaN.
TEST(QuantMedium, Fp8InfiniteMultiplierOverTheKTail) {
  const std::vector<FastKernel> kernels = fast_kernels(WeightFormat::fp8_block);
  if (kernels.empty()) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  for (const FastKernel& fast : kernels) {
    std::mt19937 rng(27);
    std::uniform_real_distribution<float> positive(0.5f, 1.0f);
    const int64_t n = 6, k = 1000;  // the last chunk, [960, 1000), has 10 of its 16 lanes
    std::vector<float> wv(static_cast<size_t>(n * k));
    for (auto& v : wv) v = positive(rng);
    auto q = quantize_fp8_block(wv.data(), n, k);
    const float inf = INFINITY;
    std::memcpy(q.scales.data() + 4 * (k / 128), &inf, 4);  // block [0, 128) x [896, 1000)
    const PackedWeight w = q.view();
    for (const int64_t m : {int64_t{1}, int64_t{5}, fast.prefill_rows}) {
      std::vector<float> x(static_cast<size_t>(m * k));
      for (auto& v : x) v = positive(rng);
      const auto want = run(fast.reference, w, x, m, k, 0, n, n);
      for (const float v : want) ASSERT_EQ(v, inf);
      expect_same(run(fast.kernel, w, x, m, k, 0, n, n), want,
                  fast.level + " fp8 infinite tail multiplier m=" + std::to_string(m));
    }
  }
}

// FP8 activations are scaled before they are rounded (linear_quant_bf16dot.hpp): x · (q · 2^8) as an f32
// product, then rounded to bf16 as VCVTNE2PS2BF16 does, an f32 subnormal product reading as zero. An
// activation whose product is subnormal but would round up to the smallest normal bf16 must add nothing
// (only the CPU's instruction decides this: the kernel must give the reference's bits), one whose product
// overflows makes the output infinite (or NaN against a zero weight), a NaN activation NaN; in a decode batch
// and in a panel batch, each row as it is alone.
TEST(QuantMedium, Fp8ScaledActivationsRoundAsTheInstruction) {
  std::mt19937 rng(41);
  const int64_t n = 3, k = 256;
  std::vector<float> wv(static_cast<size_t>(n * k), 0.0f);
  wv[5] = 448.0f;  // row 0: one E4M3 max code
  for (int64_t p = 0; p < k; ++p) wv[static_cast<size_t>(k + p)] = std::ldexp(1.0f, static_cast<int>(p % 5));
  for (int64_t p = 0; p < k; ++p) wv[static_cast<size_t>(2 * k + p)] = 0.5f;  // row 2
  auto q = quantize_fp8_block(wv.data(), n, k);
  for (size_t i = 0; i + 4 <= q.scales.size(); i += 4) {  // q = 1: the multiplier is 2^8
    const float one = 1.0f;
    std::memcpy(q.scales.data() + i, &one, 4);
  }
  const PackedWeight w = q.view();
  float below_normal;  // an f32 subnormal just under 2^-126, divided by the multiplier
  const uint32_t bits = 0x007FF000u;
  std::memcpy(&below_normal, &bits, 4);
  below_normal /= 256.0f;
  const int64_t m = 40;  // a panel batch at every level
  std::vector<float> x(static_cast<size_t>(m * k));
  for (auto& v : x) v = std::normal_distribution<float>(0.0f, 1.0f)(rng);
  for (int64_t p = 0; p < k; ++p) x[static_cast<size_t>(p)] = 0.0f;
  x[5] = below_normal;                    // row 0: the subnormal product alone
  x[static_cast<size_t>(k + 9)] = 3e38f;  // row 1: a product past FLT_MAX
  x[static_cast<size_t>(2 * k + 200)] = NAN;
  const FastKernel tile{"reference tile",
                        Isa::reference,
                        reference::linear_fp8_block_medium_tile,
                        reference::linear_fp8_block_medium_tile,
                        {},
                        0};
  std::vector<FastKernel> kernels = fast_kernels(WeightFormat::fp8_block);
  kernels.push_back(tile);  // the checks on `want` below, on the AMX level's reference too
  for (const FastKernel& fast : kernels) {
    const auto want = run(fast.reference, w, x, m, k, 0, n, n);
    EXPECT_EQ(want[0], 0.0f) << fast.level;  // row 0 against weight row 0: nothing but the flushed product
    EXPECT_TRUE(std::isinf(want[n + 1]) && want[n + 1] > 0) << fast.level;
    EXPECT_TRUE(std::isnan(want[n + 0])) << fast.level;  // infinity times a zero weight
    for (int64_t j = 0; j < n; ++j) EXPECT_TRUE(std::isnan(want[2 * n + j])) << fast.level;
    for (int64_t j = 0; j < n; ++j)
      EXPECT_TRUE(std::isfinite(want[3 * n + j]) && want[3 * n + j] != 0.0f) << fast.level;
    if (fast.kernel == fast.reference) continue;
    ASSERT_GE(m, fast.prefill_rows);
    expect_same(run(fast.kernel, w, x, m, k, 0, n, n), want,
                fast.level + " fp8 scaled activations, panel batch");
    const std::vector<float> x4(x.begin(), x.begin() + 4 * k), want4(want.begin(), want.begin() + 4 * n);
    expect_same(run(fast.kernel, w, x4, 4, k, 0, n, n), want4,
                fast.level + " fp8 scaled activations, decode batch");
  }
}

// Scale codes the fast decode leaves to the reference (MXFP4 outside 2..252, NVFP4 0x7F), an NVFP4 global
// scale ≥ 2^8 and E4M3 subnormal scales under denormals-are-zero: still the reference's bits.
TEST(QuantMedium, Fp4ScaleEdgeCases) {
  if (medium_fast() == nullptr) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  std::mt19937 rng(21);
  const int64_t n = 10, k = 320;
  auto mx = quantize_mxfp4(random_values(static_cast<size_t>(n * k), rng).data(), n, k);
  mx.scales[static_cast<size_t>(2 * (k / 32) + 3)] = 0xFF;
  mx.scales[static_cast<size_t>(7 * (k / 32) + 9)] = 0x00;  // 2^-127, in the k tail chunk
  mx.scales[static_cast<size_t>(4 * (k / 32) + 5)] = 1;     // codes the exact bf16 scaling leaves out
  mx.scales[static_cast<size_t>(8 * (k / 32) + 2)] = 253;
  auto nv = quantize_nvfp4(random_values(static_cast<size_t>(n * k), rng).data(), n, k);
  nv.scales[static_cast<size_t>(5 * (k / 16) + 1)] = 0x7F;
  for (size_t i = 0; i < nv.scales.size(); i += 3) nv.scales[i] = static_cast<uint8_t>(i % 8);  // subnormals
  auto nv_big = nv;
  nv_big.scales[static_cast<size_t>(5 * (k / 16) + 1)] = 0x30;
  nv_big.global_scale = 300.0f;
  for (const QuantizedMatrix* q : {&mx, &nv, &nv_big})
    for (const FastKernel& fast : fast_kernels(q->view().format))
      for (const int64_t m : {int64_t{1}, int64_t{4}, fast.prefill_rows}) {
        const PackedWeight w = q->view();
        const auto x = random_values(static_cast<size_t>(m * k), rng);
        const auto want = run(fast.reference, w, x, m, k, 0, n, n);
        const std::string what = fast.level + " " + weight_format_name(w.format) + " m=" + std::to_string(m);
        if (q == &mx) {
          for (int64_t i = 0; i < m; ++i) EXPECT_TRUE(std::isnan(want[i * n + 2])) << what;
        }
        expect_same(run(fast.kernel, w, x, m, k, 0, n, n), want, what);
        const unsigned csr = _mm_getcsr();
        _mm_setcsr(csr | 0x40);  // DAZ
        const auto want_daz = run(fast.reference, w, x, m, k, 0, n, n);
        const auto got_daz = run(fast.kernel, w, x, m, k, 0, n, n);
        _mm_setcsr(csr);
        expect_same(got_daz, want_daz, what + " under DAZ");
      }
}

// MXFP4's register path accumulates in the scaled domain (powers of two between blocks), which is exact only
// while nothing leaves f32's normal range; its guards must send the rest to the reference. A row whose scale
// drops from 2^73 to 2^-125 would overflow on rescaling, activations of 2^126 against codes of 2^-100 would
// overflow as scaled-domain products; the reference's outputs are finite. Codes 127 ± 32 (the guard's edge)
// and activations of 2^±64 stay on the fast path and still give the reference's bits.
TEST(QuantMedium, Mxfp4ScaledDomainGuards) {
  std::mt19937 rng(29);
  const int64_t n = 4, k = 256, blocks = k / 32;
  auto mx = quantize_mxfp4(random_values(static_cast<size_t>(n * k), rng).data(), n, k);
  for (int64_t b = 0; b < blocks; ++b) {
    mx.scales[static_cast<size_t>(0 * blocks + b)] = b < blocks / 2 ? 200 : 2;
    mx.scales[static_cast<size_t>(1 * blocks + b)] = 27;
    mx.scales[static_cast<size_t>(2 * blocks + b)] = b % 2 == 0 ? 127 - 32 : 127 + 32;
    mx.scales[static_cast<size_t>(3 * blocks + b)] = 127;
  }
  const PackedWeight w = mx.view();
  for (const float big : {0x1p126f, 0x1p64f, 0x1p-64f}) {
    const int64_t m = 3;
    auto x = random_values(static_cast<size_t>(m * k), rng);
    for (int64_t p = 5; p < k; p += 17) x[static_cast<size_t>(k + p)] = p % 2 == 0 ? big : -big;
    const auto want = run(medium_reference(), w, x, m, k, 0, n, n);
    const std::string what = "mxfp4 guards, activations " + std::to_string(std::log2(big));
    // the cases the scaled domain would overflow: weight row 0 with a plain x row, row 1 with the big one
    EXPECT_TRUE(std::isfinite(want[0 * n + 0]) && std::isfinite(want[2 * n + 0])) << what;
    EXPECT_TRUE(std::isfinite(want[1 * n + 1])) << what;
    const KernelTable* fast = medium_fast();
    if (fast == nullptr) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
    ASSERT_LT(m, avx512_bf16::kQuantPanelMinRowsMxfp4);
    expect_same(run(*fast, w, x, m, k, 0, n, n), want, what);
    for (int64_t i = 0; i < m; ++i) {
      const std::vector<float> row(x.begin() + i * k, x.begin() + (i + 1) * k);
      const std::vector<float> want_row(want.begin() + i * n, want.begin() + (i + 1) * n);
      expect_same(run(*fast, w, row, 1, k, 0, n, n), want_row, what + " row " + std::to_string(i) + " alone");
    }
  }
  // The decoded panels scale the codes exactly for every code 2..252 (no scaled domain): these weights in a
  // panel-sized batch, with the big activations among its rows, give the reference's bits too.
  const int64_t m = avx512_bf16::kQuantPanelMinRowsMxfp4 + 1;
  auto x = random_values(static_cast<size_t>(m * k), rng);
  for (int64_t p = 3; p < k; p += 13) x[static_cast<size_t>(4 * k + p)] = p % 2 == 0 ? 0x1p126f : -0x1p-64f;
  expect_same(run(*medium_fast(), w, x, m, k, 0, n, n), run(medium_reference(), w, x, m, k, 0, n, n),
              "mxfp4 guard codes in a panel batch");
  // The AMX level scales the codes exactly as the panels do, at every row count.
  for (const FastKernel& fast : fast_kernels(WeightFormat::mxfp4))
    if (fast.isa == Isa::amx)
      for (const int64_t rows : {int64_t{3}, fast.prefill_rows}) {
        const std::vector<float> xr(x.begin(), x.begin() + std::min(rows, m) * k);
        const int64_t r = std::min(rows, m);
        expect_same(run(fast.kernel, w, xr, r, k, 0, n, n), run(fast.reference, w, xr, r, k, 0, n, n),
                    "amx mxfp4 guard codes, m=" + std::to_string(r));
      }
}

// The fast FP4 path decodes each row's scale codes 32 at a time (NVFP4: 512 columns, MXFP4: 1024) and checks
// them once per tile: codes it leaves to the reference in a later group of a long row, in the last group's
// tail, and negative NVFP4 scales (E4M3 sign bit set) must still give the reference's bits, in every row.
TEST(QuantMedium, Fp4ScaleCodesInLaterGroups) {
  if (medium_fast() == nullptr) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  std::mt19937 rng(23);
  const int64_t n = 9, k = 2112;
  auto mx = quantize_mxfp4(random_values(static_cast<size_t>(n * k), rng).data(), n, k);
  mx.scales[static_cast<size_t>(1 * (k / 32) + 40)] = 0xFF;  // group 2
  mx.scales[static_cast<size_t>(6 * (k / 32) + 65)] = 0x00;  // the k tail's group
  auto nv = quantize_nvfp4(random_values(static_cast<size_t>(n * k), rng).data(), n, k);
  nv.scales[static_cast<size_t>(2 * (k / 16) + 40)] |= 0x80;  // negative, group 2
  nv.scales[static_cast<size_t>(4 * (k / 16) + 131)] = 0xB8;  // negative, the k tail
  nv.scales[static_cast<size_t>(7 * (k / 16) + 100)] = 0xFF;  // NaN
  for (const QuantizedMatrix* q : {&mx, &nv})
    for (const FastKernel& fast : fast_kernels(q->view().format))
      for (const int64_t m : {int64_t{1}, int64_t{2}, int64_t{5}, fast.prefill_rows}) {
        const PackedWeight w = q->view();
        const auto x = random_values(static_cast<size_t>(m * k), rng);
        const auto want = run(fast.reference, w, x, m, k, 0, n, n);
        const std::string what = fast.level + " " + weight_format_name(w.format) + " m=" + std::to_string(m);
        for (int64_t i = 0; i < m; ++i) {
          EXPECT_TRUE(std::isnan(want[i * n + (q == &mx ? 1 : 7)])) << what;
          EXPECT_FALSE(std::isnan(want[i * n])) << what;
        }
        expect_same(run(fast.kernel, w, x, m, k, 0, n, n), want, what);
        expect_same(run(fast.kernel, w, x, m, k, 1, n - 1, n), run(fast.reference, w, x, m, k, 1, n - 1, n),
                    what + " cols [1, n - 1)");
      }
}

// linear_forward splits the columns over the team in blocks of 8, so a panel group or a tile ends at a block
// edge for some thread counts and not others: every count must give the reference's bits.
TEST(QuantMedium, AnyThreadCountGivesTheReferenceBits) {
  const CpuFeatures features = detect_cpu_features();
  if (!isa_supported(features, Isa::avx512_bf16)) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  std::mt19937 rng(31);
  const int saved = omp_get_max_threads();
  for (const WeightFormat f : {WeightFormat::fp8_block, WeightFormat::mxfp4, WeightFormat::nvfp4})
    for (const FastKernel& fast : fast_kernels(f)) {
      KernelTable table = kernel_table(fast.isa, features, MatmulPrecision::medium);
      table.linear[static_cast<int>(f)] = fast.kernel;
      const int64_t n = 150, k = f == WeightFormat::fp8_block ? 1000 : 1024;
      const QuantizedMatrix q = quantize(f, random_values(static_cast<size_t>(n * k), rng, 0.05f), n, k);
      const PackedWeight w = q.view();
      for (const int64_t m : {int64_t{5}, fast.prefill_rows}) {
        const auto x = random_values(static_cast<size_t>(m * k), rng);
        const auto want = run(fast.reference, w, x, m, k, 0, n, n);
        for (const int threads : {1, 2, 3, 5}) {
          omp_set_num_threads(threads);
          std::vector<float> got(static_cast<size_t>(m * n));
          linear_forward(table, w, x.data(), m, got.data());
          expect_same(got, want,
                      fast.level + " " + weight_format_name(f) + " m=" + std::to_string(m) + ", " +
                          std::to_string(threads) + " threads");
        }
      }
    }
  omp_set_num_threads(saved);
}

}  // namespace
}  // namespace xmoe::kernels::quant
