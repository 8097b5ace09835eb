// The quantized linears' AVX2 / AVX-512 variants against the reference (kernels/cpu/linear_quant.hpp): bit
// for bit over decode- and prefill-shaped row counts, column sub-ranges, k tails, padded leading dimensions,
// NaN element and scale codes; and each output independent of the rest of its batch (its order depends only
// on k). The reference itself is checked against PyTorch in test_quant_formats.cpp.
#include <gtest/gtest.h>
#include <xmmintrin.h>

#include <atomic>
#include <random>
#include <string>
#include <vector>

#include "fp8_nan_flags_check.hpp"
#include "kernels/kernels.hpp"
#include "kernels/linear.hpp"
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

// ue8m0: FP8 block scales rounded up to powers of two (DeepSeek-V3.1's scale_fmt), which the AVX-512 decode
// moves onto x.
QuantizedMatrix quantize(WeightFormat f, const std::vector<float>& w, int64_t rows, int64_t cols,
                         bool ue8m0 = false) {
  if (f == WeightFormat::fp8_block) return quantize_fp8_block(w.data(), rows, cols, ue8m0);
  if (f == WeightFormat::mxfp4) return quantize_mxfp4(w.data(), rows, cols);
  return quantize_nvfp4(w.data(), rows, cols);
}

std::vector<Isa> vector_levels() {
  const CpuFeatures f = detect_cpu_features();
  std::vector<Isa> out;
  for (const Isa isa : {Isa::avx2, Isa::avx512, Isa::avx512_bf16})
    if (isa_supported(f, isa)) out.push_back(isa);
  return out;
}

// y for rows [0, m) and columns [n0, n1) of every level; the caller compares them.
std::vector<float> run(const KernelTable& t, const PackedWeight& w, const std::vector<float>& x, int64_t m,
                       int64_t ldx, int64_t n0, int64_t n1, int64_t ldy) {
  std::vector<float> y(static_cast<size_t>(m * ldy), 12345.0f);  // untouched outside [n0, n1)
  t.linear[static_cast<int>(w.format)](LinearArgs{x.data(), m, ldx, &w, n0, n1, y.data(), ldy});
  return y;
}

void expect_same(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (!test::same_float(got[i], want[i]) && ++bad < 5)
      ADD_FAILURE() << what << " at " << i << ": " << got[i] << " vs reference " << want[i];
  EXPECT_EQ(bad, 0) << what;
}

struct Shape {
  int64_t n, k;
};

void check_format(WeightFormat f, const std::vector<Shape>& shapes, bool ue8m0 = false) {
  const auto levels = vector_levels();
  if (levels.empty()) GTEST_SKIP() << "no AVX2 on this CPU";
  const CpuFeatures features = detect_cpu_features();
  std::mt19937 rng(7);
  for (const Shape s : shapes) {
    auto wv = random_values(static_cast<size_t>(s.n * s.k), rng, 0.05f);
    const QuantizedMatrix q = quantize(f, wv, s.n, s.k, ue8m0);
    const PackedWeight w = q.view();
    for (const int64_t m : {1, 2, 3, 7, 16, 33, 200}) {
      if (m == 200 && s.n * s.k > 40000) continue;  // keep the reference's time small
      const int64_t ldx = s.k + 3, ldy = s.n + 2;
      const auto x = random_values(static_cast<size_t>(m * ldx), rng);
      for (const auto& [n0, n1] : {std::pair<int64_t, int64_t>{0, s.n}, {s.n / 3, s.n - s.n / 4}}) {
        if (n0 >= n1) continue;
        const auto want = run(reference_kernel_table(), w, x, m, ldx, n0, n1, ldy);
        for (const Isa isa : levels) {
          const std::string what = std::string(weight_format_name(f)) + " " + isa_name(isa) +
                                   " n=" + std::to_string(s.n) + " k=" + std::to_string(s.k) +
                                   " m=" + std::to_string(m) + " cols [" + std::to_string(n0) + ", " +
                                   std::to_string(n1) + ")";
          expect_same(run(kernel_table(isa, features), w, x, m, ldx, n0, n1, ldy), want, what);
        }
        // One row alone gives the bits it gets inside the batch.
        if (m > 1) {
          const std::vector<float> x_last(x.end() - ldx, x.end());
          const auto alone = run(best_kernel_table(features), w, x_last, 1, ldx, n0, n1, ldy);
          const std::vector<float> in_batch(want.end() - ldy, want.end());
          expect_same(alone, in_batch, std::string(weight_format_name(f)) + " last row alone");
        }
      }
    }
  }
}

TEST(QuantLinear, Fp8BlockVariantsMatchReferenceBitForBit) {
  check_format(WeightFormat::fp8_block, {{1, 16}, {9, 40}, {37, 136}, {130, 300}, {20, 1029}});
}
// Power-of-two block scales: columns [102, 229) of 306 rows start tiles of 4 rows at 126, across the 128-row
// block edge (which take the multiplier per row).
TEST(QuantLinear, Fp8BlockPowerOfTwoScalesMatchReferenceBitForBit) {
  check_format(WeightFormat::fp8_block, {{1, 16}, {9, 40}, {37, 136}, {306, 300}, {20, 1029}}, true);
}
TEST(QuantLinear, Mxfp4VariantsMatchReferenceBitForBit) {
  check_format(WeightFormat::mxfp4, {{1, 32}, {9, 96}, {37, 160}, {130, 320}, {20, 1024}});
}
TEST(QuantLinear, Nvfp4VariantsMatchReferenceBitForBit) {
  check_format(WeightFormat::nvfp4, {{1, 16}, {9, 48}, {37, 80}, {130, 304}, {20, 1040}});
}

// NaN element codes (E4M3 0x7F) and NaN scales (E8M0 0xFF) poison exactly the outputs they feed, in every
// variant alike; an infinite FP8 scale in a k tail block does not leak into masked lanes.
TEST(QuantLinear, NaNCodesAndScales) {
  const CpuFeatures features = detect_cpu_features();
  std::mt19937 rng(11);
  const int64_t n = 6, k = 40;
  auto fp8 = quantize_fp8_block(random_values(n * k, rng).data(), n, k, false, 16);
  fp8.data[2 * k + 5] = 0x7F;  // row 2
  const float inf = INFINITY;
  std::memcpy(fp8.scales.data() + 4 * (0 * 3 + 2), &inf, 4);  // rows 0..15, columns 32..39 (the tail block)
  const float huge = 0x1p125f;  // scale · 2^8 would overflow: the AVX-512 decode's two-step product
  std::memcpy(fp8.scales.data() + 4 * 1, &huge, 4);
  auto mx = quantize_mxfp4(random_values(n * 64, rng).data(), n, 64);
  mx.scales[4 * 2 + 1] = 0xFF;  // row 4, second block
  for (const QuantizedMatrix* q : {&fp8, &mx})
    for (const int64_t m : {3, 5, 17}) {  // the decode path, its slices by groups of rows, the panel path
      const PackedWeight w = q->view();
      const auto x = random_values(static_cast<size_t>(m * w.cols), rng);
      const auto want = run(reference_kernel_table(), w, x, m, w.cols, 0, n, n);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          const bool poisoned = q == &mx ? j == 4 : true;  // an infinite scale times a nonzero weight
          EXPECT_EQ(std::isnan(want[i * n + j]) || std::isinf(want[i * n + j]), poisoned) << i << ", " << j;
        }
      for (const Isa isa : vector_levels())
        expect_same(run(kernel_table(isa, features), w, x, m, w.cols, 0, n, n), want,
                    std::string("NaN case ") + weight_format_name(w.format) + " " + isa_name(isa) +
                        " m=" + std::to_string(m));
    }
}

// NaN element codes among ordinary block scales, at the decode shapes (m = 1..3, where the fast decode paths
// run), one row past a full tile, batch shapes (m = 5, 13: by level the decode paths over slices of rows, or
// panels) and a prefill shape (m = 17: panels decoded by the same integer decode at every level): each NaN
// poisons its own column's outputs only, exactly as the reference.
TEST(QuantLinear, NaNCodesAtDecodeAndPrefillShapes) {
  const CpuFeatures features = detect_cpu_features();
  std::mt19937 rng(13);
  const int64_t n = 19, k = 272;
  auto fp8 = quantize_fp8_block(random_values(n * k, rng).data(), n, k);
  fp8.data[3 * k + 17] = 0x7F;   // row 3
  fp8.data[9 * k + 270] = 0xFF;  // row 9, in the k tail
  fp8.data[18 * k + 0] = 0xFF;   // row 18, a single-row tile
  const PackedWeight w = fp8.view();
  for (const int64_t m : {1, 2, 3, 5, 13, 17}) {
    const auto x = random_values(static_cast<size_t>(m * k), rng);
    const auto want = run(reference_kernel_table(), w, x, m, k, 0, n, n);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j)
        EXPECT_EQ(std::isnan(want[i * n + j]), j == 3 || j == 9 || j == 18) << i << ", " << j;
    for (const Isa isa : vector_levels())
      expect_same(run(kernel_table(isa, features), w, x, m, k, 0, n, n), want,
                  "fp8 NaN codes m=" + std::to_string(m) + " " + isa_name(isa));
  }
}

// The FP8 decodes (m ≤ 3 here at every level) record the rows they found free of NaN codes in the view's
// flags and leave the check out on those rows later (test::expect_nan_free_row_flags), with f32 and
// power-of-two multipliers alike.
TEST(QuantLinear, Fp8NanFreeRowFlags) {
  const auto levels = vector_levels();
  if (levels.empty()) GTEST_SKIP() << "no AVX2 on this CPU";
  const CpuFeatures features = detect_cpu_features();
  for (const bool ue8m0 : {false, true})
    for (const Isa isa : levels)
      for (const int64_t m : {1, 2, 3})
        test::expect_nan_free_row_flags(
            kernel_table(isa, features).linear[static_cast<int>(WeightFormat::fp8_block)],
            reference_kernel_table().linear[static_cast<int>(WeightFormat::fp8_block)], ue8m0, m,
            std::string(isa_name(isa)) + (ue8m0 ? " ue8m0" : "") + " m=" + std::to_string(m));
}

// The prefill panels (here 40 x rows at every level) flag the clean rows they decode too, so a prompt leaves
// its experts' rows trusted for the decode steps after it.
TEST(QuantLinear, Fp8PanelsFlagCleanRows) {
  const auto levels = vector_levels();
  if (levels.empty()) GTEST_SKIP() << "no AVX2 on this CPU";
  const CpuFeatures features = detect_cpu_features();
  for (const Isa isa : levels)
    test::expect_panels_flag_clean_rows(
        kernel_table(isa, features).linear[static_cast<int>(WeightFormat::fp8_block)],
        reference_kernel_table().linear[static_cast<int>(WeightFormat::fp8_block)], 40, isa_name(isa));
}

// A slice of rows has its rows' flags.
TEST(QuantLinear, SliceOfRowsKeepsItsRowsFlags) {
  std::mt19937 rng(23);
  auto fp8 = quantize_fp8_block(random_values(256 * 32, rng).data(), 256, 32);
  std::vector<std::atomic<uint8_t>> flags(256);
  PackedWeight w = fp8.view();
  w.nan_free_rows = flags.data();
  EXPECT_EQ(slice_rows(w, 128, 128).nan_free_rows, flags.data() + 128);
  EXPECT_EQ(slice_rows(fp8.view(), 128, 128).nan_free_rows, nullptr);
}

// FP8 block multipliers on both sides of the AVX-512 decode's bound (|s| < 2^8, where s · 2^120 is exact),
// a subnormal one, and a zero one, at the decode, batch (m = 6: slices by groups of x rows) and prefill
// shapes: every level still returns the reference's bits.
TEST(QuantLinear, Fp8ScaleRangesAtDecodeAndPrefillShapes) {
  const CpuFeatures features = detect_cpu_features();
  std::mt19937 rng(17);
  const int64_t n = 9, k = 200;
  for (const float s : {255.9f, 256.0f, 3.0e5f, 0x1p-140f, 0.0f}) {
    auto fp8 = quantize_fp8_block(random_values(n * k, rng).data(), n, k);
    std::memcpy(fp8.scales.data() + 4 * 1, &s, 4);  // columns 128..199: a 64-column step and a tail
    const PackedWeight w = fp8.view();
    for (const int64_t m : {1, 2, 3, 6, 17}) {
      const auto x = random_values(static_cast<size_t>(m * k), rng);
      const auto want = run(reference_kernel_table(), w, x, m, k, 0, n, n);
      for (const Isa isa : vector_levels())
        expect_same(run(kernel_table(isa, features), w, x, m, k, 0, n, n), want,
                    "fp8 scale " + std::to_string(s) + " m=" + std::to_string(m) + " " + isa_name(isa));
    }
  }
}

// Power-of-two multipliers on both sides of the range the AVX-512 decode moves onto x ([2^-100, 2^7]), and x
// values whose product with the multiplier · 2^120 overflows (3e38 · 2^100) or is denormal (1e-44 · 2^20):
// every level still returns the reference's bits, at the decode, batch and prefill shapes.
TEST(QuantLinear, Fp8PowerOfTwoScalesAtTheEdgesOfTheScaledXRange) {
  const CpuFeatures features = detect_cpu_features();
  std::mt19937 rng(23);
  const int64_t n = 9, k = 200;
  for (const float s : {0x1p-100f, 0x1p-101f, 0x1p7f, 0x1p8f, 0x1p-20f}) {
    auto fp8 = quantize_fp8_block(random_values(n * k, rng).data(), n, k, true);
    std::memcpy(fp8.scales.data() + 4 * 1, &s, 4);  // columns 128..199: a 64-column step and a tail
    const PackedWeight w = fp8.view();
    for (const int64_t m : {1, 2, 5, 6, 17}) {
      for (const float special : {1.0f, 3e38f, 1e-44f}) {
        auto x = random_values(static_cast<size_t>(m * k), rng);
        x[static_cast<size_t>((m - 1) * k + 150)] = special;  // the last row, in the block of multiplier s
        const auto want = run(reference_kernel_table(), w, x, m, k, 0, n, n);
        for (const Isa isa : vector_levels())
          expect_same(run(kernel_table(isa, features), w, x, m, k, 0, n, n), want,
                      "fp8 scale " + std::to_string(s) + ", x " + std::to_string(special) +
                          ", m=" + std::to_string(m) + " " + isa_name(isa));
      }
    }
  }
}

// With denormals-are-zero set (as some libraries leave MXCSR), every level still returns the reference's bits
// for E4M3 subnormal codes at a decode, a batch and a prefill shape (the AVX-512 integer decode's f32
// intermediates are subnormal, so it must not run then).
TEST(QuantLinear, Fp8SubnormalCodesUnderDenormalsAreZero) {
  const CpuFeatures features = detect_cpu_features();
  if (vector_levels().empty()) GTEST_SKIP() << "no AVX2 on this CPU";
  std::mt19937 rng(19);
  const int64_t n = 8, k = 128;
  auto fp8 = quantize_fp8_block(random_values(n * k, rng).data(), n, k);
  for (int64_t i = 0; i < n * k; ++i) fp8.data[i] = static_cast<uint8_t>((i % 7) + 1 + (i % 2) * 0x80);
  const PackedWeight w = fp8.view();
  for (const int64_t m : {1, 5, 17}) {
    const auto x = random_values(static_cast<size_t>(m * k), rng);
    const auto want = run(reference_kernel_table(), w, x, m, k, 0, n, n);
    const unsigned csr = _mm_getcsr();
    _mm_setcsr(csr | 0x40);  // DAZ
    std::vector<std::vector<float>> got;
    for (const Isa isa : vector_levels())
      got.push_back(run(kernel_table(isa, features), w, x, m, k, 0, n, n));
    _mm_setcsr(csr);
    for (const auto& g : got) expect_same(g, want, "fp8 subnormal codes under DAZ m=" + std::to_string(m));
    for (const float v : want) EXPECT_NE(v, 0.0f);
  }
}

// Every scale code of both FP4 formats (E8M0 2^-127 … 2^127 and NaN; E4M3 subnormal, normal and NaN, times
// a global scale), every element code, at the decode shapes (where the AVX2 level looks up E2M1 values and
// MXFP4's products as bf16 bytes) and a panel shape, under each of flush-to-zero and denormals-are-zero:
// every level returns the reference's bits, subnormal, infinite and NaN products included.
TEST(QuantLinear, Fp4EveryScaleCodeUnderEitherDenormalMode) {
  const CpuFeatures features = detect_cpu_features();
  if (vector_levels().empty()) GTEST_SKIP() << "no AVX2 on this CPU";
  std::mt19937 rng(23);
  const int64_t n = 9, k = 1024;  // 9 rows x 32 MXFP4 blocks / 64 NVFP4 blocks: 288 / 576 scale slots
  for (const WeightFormat f : {WeightFormat::mxfp4, WeightFormat::nvfp4}) {
    QuantizedMatrix q = quantize(f, random_values(static_cast<size_t>(n * k), rng, 0.05f), n, k);
    for (size_t i = 0; i < q.data.size(); ++i) q.data[i] = static_cast<uint8_t>(i * 37 + i / 7);
    for (size_t i = 0; i < q.scales.size(); ++i) q.scales[i] = static_cast<uint8_t>(i);  // every code
    // Row 0 of MXFP4 only 2^-127..2^-125, so its sums are tiny enough to show a subnormal product; NVFP4's
    // global scale puts its small codes' multipliers (and products) below the f32 normals.
    if (f == WeightFormat::mxfp4)
      for (int64_t b = 0; b < k / 32; ++b) q.scales[static_cast<size_t>(b)] = static_cast<uint8_t>(b % 3);
    if (f == WeightFormat::nvfp4) q.global_scale = 0x1p-120f;
    const PackedWeight w = q.view();
    for (const unsigned mode : {0u, 0x8000u, 0x40u, 0x8040u}) {  // none, FTZ, DAZ, both
      for (const int64_t m : {1, 2, 3, 5}) {
        const auto x = random_values(static_cast<size_t>(m * k), rng);
        const unsigned csr = _mm_getcsr();
        _mm_setcsr(csr | mode);
        const auto want = run(reference_kernel_table(), w, x, m, k, 0, n, n);
        std::vector<std::vector<float>> got;
        for (const Isa isa : vector_levels())
          got.push_back(run(kernel_table(isa, features), w, x, m, k, 0, n, n));
        _mm_setcsr(csr);
        for (size_t l = 0; l < got.size(); ++l)
          expect_same(got[l], want,
                      std::string(weight_format_name(f)) + " every scale code, mode " + std::to_string(mode) +
                          " m=" + std::to_string(m) + " " + isa_name(vector_levels()[l]));
      }
    }
  }
}

// Batch shapes over more weight rows than one slice of the AVX2 byte-lookup path (128 KiB: 256 FP8 rows of
// 512 columns, ~470 FP4 rows) and of the AVX-512 decode path's (256 KiB: 512 FP8 rows, ~900 FP4 rows), so
// several slices each run by several groups of x rows (row counts on either side of the AVX-512 FP8 and FP4
// limits), over a column sub-range that starts and ends inside a slice: every level returns the reference's
// bits.
TEST(QuantLinear, BatchShapesOverSeveralSlicesOfRows) {
  const CpuFeatures features = detect_cpu_features();
  if (vector_levels().empty()) GTEST_SKIP() << "no AVX2 on this CPU";
  std::mt19937 rng(29);
  const int64_t n = 2100, k = 512;
  for (const WeightFormat f : {WeightFormat::fp8_block, WeightFormat::mxfp4, WeightFormat::nvfp4}) {
    const QuantizedMatrix q = quantize(f, random_values(static_cast<size_t>(n * k), rng, 0.05f), n, k);
    const PackedWeight w = q.view();
    for (const int64_t m : {4, 5, 6, 7, 8, 9, 16, 17}) {
      const auto x = random_values(static_cast<size_t>(m * k), rng);
      for (const auto& [n0, n1] : {std::pair<int64_t, int64_t>{0, n}, {131, 2001}}) {
        const auto want = run(reference_kernel_table(), w, x, m, k, n0, n1, n);
        for (const Isa isa : vector_levels())
          expect_same(run(kernel_table(isa, features), w, x, m, k, n0, n1, n), want,
                      std::string(weight_format_name(f)) + " m=" + std::to_string(m) + " cols [" +
                          std::to_string(n0) + ", " + std::to_string(n1) + ") " + isa_name(isa));
      }
    }
  }
}

// Rows long enough that 4 x rows outgrow L1 (k = 4096 and 4160): the AVX2 byte-lookup FP4 paths run them over
// blocks of columns, each tile's chains carried from block to block (4160: a last block shorter than the
// others); FP8 rows with NaN codes near their start, middle and end. Every level returns the reference's
// bits, NaN outputs included.
TEST(QuantLinear, LongRowsOverBlocksOfColumns) {
  const CpuFeatures features = detect_cpu_features();
  if (vector_levels().empty()) GTEST_SKIP() << "no AVX2 on this CPU";
  std::mt19937 rng(31);
  const int64_t n = 37;
  for (const WeightFormat f : {WeightFormat::fp8_block, WeightFormat::mxfp4, WeightFormat::nvfp4})
    for (const int64_t k : {4096, 4160}) {
      QuantizedMatrix q = quantize(f, random_values(static_cast<size_t>(n * k), rng, 0.05f), n, k);
      if (f == WeightFormat::fp8_block) {
        q.data[3 * k + 5] = 0x7F;
        q.data[20 * k + k / 2 + 7] = 0xFF;
        q.data[30 * k + k - 1] = 0x7F;
      }
      const PackedWeight w = q.view();
      for (const int64_t m : {4, 8, 13}) {
        const auto x = random_values(static_cast<size_t>(m * k), rng);
        for (const auto& [n0, n1] : {std::pair<int64_t, int64_t>{0, n}, {5, 33}}) {
          const auto want = run(reference_kernel_table(), w, x, m, k, n0, n1, n);
          for (const Isa isa : vector_levels())
            expect_same(run(kernel_table(isa, features), w, x, m, k, n0, n1, n), want,
                        std::string(weight_format_name(f)) + " k=" + std::to_string(k) +
                            " m=" + std::to_string(m) + " cols [" + std::to_string(n0) + ", " +
                            std::to_string(n1) + ") " + isa_name(isa));
        }
      }
    }
}

}  // namespace
}  // namespace xmoe::kernels::quant
