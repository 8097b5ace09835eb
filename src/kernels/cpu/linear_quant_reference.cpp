// The quantized linears' oracle: each weight row decoded by PackedWeight::row_to_f32 (PyTorch's
// dequantisation), then plain lane loops in the shared summation order (linear_quant.hpp).
#include <xmmintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/linear_lanes.hpp"
#include "kernels/cpu/linear_quant.hpp"
#include "kernels/quant/block_scale.hpp"
#include "kernels/quant/codecs.hpp"
#include "xmoe/error.hpp"

namespace xmoe::kernels {

namespace quant {
void fill_scale_table(const PackedWeight& w, float table[256]) {
  for (int c = 0; c < 256; ++c) {
    const uint8_t code = static_cast<uint8_t>(c);
    const float s = w.scale_type == ScaleType::e8m0 ? e8m0_to_f32(code) : e4m3_to_f32(code);
    table[c] = w.format == WeightFormat::nvfp4 ? s * w.global_scale : s;
  }
}

Fp8DecodeForms fp8_decode_forms(const LinearArgs& a) {
  constexpr unsigned kDenormalsAreZero = 0x40;  // MXCSR.DAZ
  const PackedWeight& w = *a.w;
  if ((_mm_getcsr() & kDenormalsAreZero) != 0) return {};
  bool powers_of_two = true;  // every multiplier s = 2^(e - 1) with -99 <= e <= 8
  float lo = 0x1p7f, hi = 0x1p-100f;
  const int64_t blocks = (w.cols + w.block_cols - 1) / w.block_cols;
  for (int64_t r = a.n0 / w.block_rows; r * w.block_rows < a.n1; ++r)
    for (int64_t b = 0; b < blocks; ++b) {
      const float s = decode_scale(w.scale_type, w.scales, r * w.scale_row_stride + b);
      if (!(std::fabs(s) < 0x1p8f)) return {};  // NaN too
      int e = 0;
      powers_of_two = powers_of_two && s > 0 && std::frexp(s, &e) == 0.5f && e >= -99 && e <= 8;
      lo = std::min(lo, s);
      hi = std::max(hi, s);
    }
  Fp8DecodeForms forms;
  forms.integer_decode = true;
  if (a.m != 1 || !powers_of_two) return forms;
  float x_min = std::numeric_limits<float>::infinity(), x_max = 0.0f;  // of the nonzero magnitudes
  bool nan = false;
  for (int64_t p = 0; p < w.cols; ++p) {
    const float mag = std::fabs(a.x[p]);
    nan |= mag != mag;
    x_max = std::max(x_max, mag);
    x_min = std::min(x_min, mag == 0.0f ? std::numeric_limits<float>::infinity() : mag);
  }
  // Powers of two: each product is exact unless it leaves the normal range, so the extremes decide.
  const double largest = double(x_max) * hi * 0x1p120, least = double(x_min) * lo * 0x1p120;
  forms.scaled_x = !nan && largest <= double(std::numeric_limits<float>::max()) &&
                   (x_max == 0.0f || least >= double(std::numeric_limits<float>::min()));
  return forms;
}

void reference_part(const LinearArgs& args, LinearFn reference, int64_t i0, int64_t rows, int64_t n,
                    int64_t cols) {
  reference(args_part(args, i0, rows, n, cols));
}

void check_linear_args(const LinearArgs& a, WeightFormat format) {
  XMOE_CHECK(a.w != nullptr, "linear: weight is null");
  const PackedWeight& w = *a.w;
  XMOE_CHECK(w.format == format, "linear: weight format is ", weight_format_name(w.format),
             ", kernel is for ", weight_format_name(format));
  XMOE_CHECK(a.m >= 0 && a.n0 >= 0 && a.n0 <= a.n1 && a.n1 <= w.rows, "linear: rows m=", a.m, ", columns [",
             a.n0, ", ", a.n1, ") out of range for a weight of ", w.rows, " rows");
  XMOE_CHECK(
      a.m == 0 || a.n0 == a.n1 || (a.x != nullptr && a.y != nullptr && a.ldx >= w.cols && a.ldy >= a.n1),
      "linear: x/y null or leading dimension too small (ldx=", a.ldx, ", ldy=", a.ldy, ")");
  XMOE_CHECK(w.data != nullptr && w.scales != nullptr, "linear: ", weight_format_name(format),
             " weight without data or scales");
  switch (format) {
    case WeightFormat::fp8_block:
      XMOE_CHECK(w.scale_type == ScaleType::f32 || w.scale_type == ScaleType::e8m0,
                 "linear: fp8_block scale type must be f32 or e8m0");
      XMOE_CHECK(w.block_rows > 0 && w.block_cols > 0 && w.block_cols % 16 == 0,
                 "linear: fp8_block block size ", w.block_rows, "x", w.block_cols,
                 " unsupported (columns must be a multiple of 16)");
      XMOE_CHECK(w.row_bytes >= w.cols, "linear: fp8_block row_bytes ", w.row_bytes, " < cols ", w.cols);
      break;
    case WeightFormat::mxfp4:
      XMOE_CHECK(w.scale_type == ScaleType::e8m0 && w.block_rows == 1 && w.block_cols == 32,
                 "linear: mxfp4 needs e8m0 scales over 1x32 blocks");
      XMOE_CHECK(w.cols % 32 == 0 && w.row_bytes >= w.cols / 2, "linear: mxfp4 columns ", w.cols,
                 " must be a multiple of 32");
      break;
    case WeightFormat::nvfp4:
      XMOE_CHECK(w.scale_type == ScaleType::e4m3 && w.block_rows == 1 && w.block_cols == 16,
                 "linear: nvfp4 needs e4m3 scales over 1x16 blocks");
      XMOE_CHECK(w.cols % 16 == 0 && w.row_bytes >= w.cols / 2, "linear: nvfp4 columns ", w.cols,
                 " must be a multiple of 16");
      break;
    default:
      XMOE_CHECK(false, "linear: ", weight_format_name(format), " is not a block-quantized format");
  }
  XMOE_CHECK(w.scale_row_stride >= (w.cols + w.block_cols - 1) / w.block_cols, "linear: scale_row_stride ",
             w.scale_row_stride, " shorter than the ", (w.cols + w.block_cols - 1) / w.block_cols,
             " blocks of a row");
}
}  // namespace quant

namespace reference {
namespace {
void linear_any(const LinearArgs& a, WeightFormat format) {
  quant::check_linear_args(a, format);
  const int64_t k = a.w->cols;
  std::vector<float> row(static_cast<size_t>(k));
  for (int64_t n = a.n0; n < a.n1; ++n) {
    a.w->row_to_f32(n, row.data());
    for (int64_t i = 0; i < a.m; ++i) {
      float lanes[16] = {};
      const float* x = a.x + i * a.ldx;
      for (int64_t p = 0; p < k; ++p) lanes[p % 16] = std::fma(x[p], row[p], lanes[p % 16]);
      a.y[i * a.ldy + n] = reduce_lanes(lanes);
    }
  }
}
}  // namespace

void linear_fp8_block(const LinearArgs& args) {
  linear_any(args, WeightFormat::fp8_block);
}
void linear_mxfp4(const LinearArgs& args) {
  linear_any(args, WeightFormat::mxfp4);
}
void linear_nvfp4(const LinearArgs& args) {
  linear_any(args, WeightFormat::nvfp4);
}
}  // namespace reference

}  // namespace xmoe::kernels
