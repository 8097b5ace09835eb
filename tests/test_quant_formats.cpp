// The quantized formats against PyTorch (tests/data/quant, tools/make_quant_fixtures.py): the quantizers
// write byte-identical tensors to the reference quantizers (transformers' Fp8Quantize, triton_kernels'
// downcast_to_mxfp, ModelOpt's NVFP4QTensor), PackedWeight::row_to_f32 reproduces the reference
// dequantisation bit for bit, and the reference linear is within 8e-7 · Σ|x·w| of the f64 product
// x·dequant(W)ᵀ.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/linear_quant.hpp"
#include "kernels/kernels.hpp"
#include "kernels/quant/codecs.hpp"
#include "kernels/quant/quantize.hpp"
#include "quant_fixture.hpp"
#include "xmoe/error.hpp"

namespace xmoe::kernels::quant {
namespace {

using test::fixture_bf16_as_f32;
using test::fixture_values;
using test::same_float;

void expect_dequant_equal(const PackedWeight& w, const std::vector<float>& want) {
  ASSERT_EQ(want.size(), static_cast<size_t>(w.rows * w.cols));
  std::vector<float> row(static_cast<size_t>(w.cols));
  int bad = 0;
  for (int64_t r = 0; r < w.rows; ++r) {
    w.row_to_f32(r, row.data());
    for (int64_t c = 0; c < w.cols; ++c)
      if (!same_float(row[c], want[r * w.cols + c]) && ++bad < 10)
        ADD_FAILURE() << weight_format_name(w.format) << " (" << r << ", " << c << "): " << row[c]
                      << " vs torch " << want[r * w.cols + c];
  }
  EXPECT_EQ(bad, 0);
}

// The reference linear against torch's f64 x · dequant(W)ᵀ.
void expect_linear_close(const PackedWeight& w, const SafetensorsFile& f) {
  const auto x = fixture_values<float>(f, "x");
  const auto y64 = fixture_values<double>(f, "y");
  const auto dq = fixture_values<float>(f, "dequant");
  const int64_t m = static_cast<int64_t>(x.size()) / w.cols;
  std::vector<float> y(static_cast<size_t>(m * w.rows), -1.0f);
  LinearArgs a{x.data(), m, w.cols, &w, 0, w.rows, y.data(), w.rows};
  reference_kernel_table().linear[static_cast<int>(w.format)](a);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t n = 0; n < w.rows; ++n) {
      double abs_sum = 0;
      for (int64_t k = 0; k < w.cols; ++k)
        abs_sum += std::fabs(double(x[i * w.cols + k]) * dq[n * w.cols + k]);
      EXPECT_NEAR(y[i * w.rows + n], y64[i * w.rows + n], 8e-7 * abs_sum + 1e-30)
          << "(" << i << ", " << n << ")";
    }
}

TEST(QuantFormats, Fp8BlockQuantizerMatchesTransformers) {
  const auto f = test::quant_fixture("fp8_block");
  const auto w = fixture_bf16_as_f32(f, "w");
  const auto& e = f.entry("w");
  const int64_t rows = e.shape[0], cols = e.shape[1];
  for (const bool ue8m0 : {false, true}) {
    SCOPED_TRACE(ue8m0 ? "ue8m0" : "f32 scales");
    const std::string suffix = ue8m0 ? "_ue8m0" : "";
    const QuantizedMatrix q = quantize_fp8_block(w.data(), rows, cols, ue8m0);
    EXPECT_EQ(q.data, fixture_values<uint8_t>(f, "weight" + suffix));
    EXPECT_EQ(q.scales, fixture_values<uint8_t>(f, "weight_scale_inv" + suffix));
    EXPECT_EQ(q.scale_shape, f.entry("weight_scale_inv" + suffix).shape);
    if (ue8m0) {
      for (const float s : fixture_values<float>(f, "weight_scale_inv_ue8m0"))
        EXPECT_EQ(std::exp2(std::round(std::log2(s))), s) << "not a power of two";
    }
  }
  const QuantizedMatrix q = quantize_fp8_block(w.data(), rows, cols);
  expect_dequant_equal(q.view(), fixture_values<float>(f, "dequant"));
  expect_linear_close(q.view(), f);
}

TEST(QuantFormats, Mxfp4QuantizerMatchesTritonKernels) {
  const auto f = test::quant_fixture("mxfp4");
  const auto w = fixture_bf16_as_f32(f, "w");
  const int64_t rows = f.entry("w").shape[0], cols = f.entry("w").shape[1];
  const QuantizedMatrix q = quantize_mxfp4(w.data(), rows, cols);
  EXPECT_EQ(q.data, fixture_values<uint8_t>(f, "blocks"));  // [rows, cols/32, 16] is the same bytes
  EXPECT_EQ(q.scales, fixture_values<uint8_t>(f, "scales"));
  EXPECT_EQ(q.scale_shape, f.entry("scales").shape);
  expect_dequant_equal(q.view(), fixture_values<float>(f, "dequant"));
  expect_linear_close(q.view(), f);
}

TEST(QuantFormats, Nvfp4QuantizerMatchesModelOpt) {
  const auto f = test::quant_fixture("nvfp4");
  const auto w = fixture_bf16_as_f32(f, "w");
  const int64_t rows = f.entry("w").shape[0], cols = f.entry("w").shape[1];
  const QuantizedMatrix q = quantize_nvfp4(w.data(), rows, cols);
  EXPECT_EQ(test::float_bits(q.global_scale),
            test::float_bits(fixture_values<float>(f, "weight_scale_2").at(0)));
  EXPECT_EQ(q.data, fixture_values<uint8_t>(f, "weight"));
  EXPECT_EQ(q.scales, fixture_values<uint8_t>(f, "weight_scale"));
  EXPECT_EQ(q.scale_shape, f.entry("weight_scale").shape);
  expect_dequant_equal(q.view(), fixture_values<float>(f, "dequant"));
  expect_linear_close(q.view(), f);
}

TEST(QuantFormats, ZeroBlocksAndNaNCodes) {
  // All-zero blocks: FP8 scale 1 (transformers keeps zeros stable), MXFP4 scale code 0, NVFP4 block scale 1.
  std::vector<float> zeros(2 * 32, 0.0f);
  const auto fp8 = quantize_fp8_block(zeros.data(), 2, 32);
  float s;
  std::memcpy(&s, fp8.scales.data(), 4);
  EXPECT_EQ(s, 1.0f);
  EXPECT_EQ(quantize_mxfp4(zeros.data(), 2, 32).scales[0], 0);
  EXPECT_EQ(e4m3_to_f32(quantize_nvfp4(zeros.data(), 2, 32, 1.0f).scales[0]), 1.0f);
  // NaN element and scale codes decode to NaN through row_to_f32.
  QuantizedMatrix q = quantize_mxfp4(std::vector<float>(32, 1.0f).data(), 1, 32);
  q.scales[0] = 0xFF;
  std::vector<float> row(32);
  q.view().row_to_f32(0, row.data());
  for (const float v : row) EXPECT_TRUE(std::isnan(v));
  QuantizedMatrix p = quantize_fp8_block(std::vector<float>(16, 1.0f).data(), 1, 16);
  p.data[3] = 0xFF;
  std::vector<float> prow(16);
  p.view().row_to_f32(0, prow.data());
  EXPECT_TRUE(std::isnan(prow[3]));
  EXPECT_EQ(prow[2], 1.0f);
}

TEST(QuantFormats, BadShapesAndArgumentsAreNamed) {
  std::vector<float> w(48, 1.0f);
  EXPECT_THROW(quantize_mxfp4(w.data(), 3, 16), Error);  // 16 columns: not a multiple of 32
  EXPECT_THROW(quantize_nvfp4(w.data(), 6, 8), Error);   // 8 columns: not a multiple of 16
  const QuantizedMatrix q = quantize_nvfp4(w.data(), 3, 16);
  PackedWeight v = q.view();
  std::vector<float> x(16, 1.0f), y(3);
  LinearArgs a{x.data(), 1, 16, &v, 0, 3, y.data(), 3};
  const auto& table = reference_kernel_table();
  EXPECT_THROW(table.linear[static_cast<int>(WeightFormat::fp8_block)](a), Error);  // wrong format
  a.n1 = 4;
  EXPECT_THROW(table.linear[static_cast<int>(WeightFormat::nvfp4)](a), Error);  // past the last row
  a.n1 = 3;
  v.block_cols = 32;
  try {
    table.linear[static_cast<int>(WeightFormat::nvfp4)](a);
    FAIL() << "block size 32 accepted for nvfp4";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("1x16"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace xmoe::kernels::quant
