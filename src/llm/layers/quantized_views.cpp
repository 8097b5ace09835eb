#include "llm/layers/quantized_views.hpp"

#include <cmath>
#include <cstring>
#include <vector>

#include "xmoe/error.hpp"

namespace xmoe::llm {

namespace {

using kernels::PackedWeight;
using kernels::ScaleType;
using kernels::WeightFormat;

std::string module_of(const std::string& name) {
  const std::string suffix = ".weight";
  if (name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
    return name.substr(0, name.size() - suffix.size());
  return name;
}

// One tensor of a quantized linear, checked for dtype and shape (the shape with a leading [count] when
// count > 0). `role` says what the tensor is for, in messages.
class Reader {
 public:
  Reader(const Checkpoint& ckpt, const std::string& linear, int64_t count)
      : ckpt_(ckpt), linear_(linear), count_(count) {}

  WeightView get(const std::string& name, TensorDType dtype, std::vector<int64_t> shape,
                 const char* role) const {
    XMOE_CHECK(ckpt_.contains(name), "checkpoint ", ckpt_.dir(), ": tensor '", name, "' is missing (", role,
               " of the quantized weight '", linear_, "', ", quant_scheme_name(ckpt_.quantization().scheme),
               ")");
    if (count_ > 0) shape.insert(shape.begin(), count_);
    const WeightView v = ckpt_.weight(name, shape);
    XMOE_CHECK(v.dtype == dtype, "checkpoint ", ckpt_.dir(), ": tensor '", name, "' (", role, " of '",
               linear_, "') has dtype ", tensor_dtype_name(v.dtype), ", expected ", tensor_dtype_name(dtype));
    return v;
  }
  // An f32 scalar stored as [] or [1] (per expert: [count] or [count, 1]); every expert's must be equal,
  // since one view carries one global scale.
  float scalar(const std::string& name, const char* role) const {
    XMOE_CHECK(ckpt_.contains(name), "checkpoint ", ckpt_.dir(), ": tensor '", name, "' is missing (", role,
               " of the quantized weight '", linear_, "')");
    const WeightView v = ckpt_.weight(name);
    XMOE_CHECK(v.dtype == TensorDType::f32 && v.numel() == std::max<int64_t>(count_, 1), "checkpoint ",
               ckpt_.dir(), ": tensor '", name, "' (", role, " of '", linear_, "') must be one F32 value",
               count_ > 0 ? " per expert" : "", ", got ", tensor_dtype_name(v.dtype), " with ", v.numel(),
               " elements");
    std::vector<float> values(static_cast<size_t>(v.numel()));
    v.to_f32(0, v.numel(), values.data());
    for (float x : values)
      XMOE_CHECK(x == values[0], "checkpoint ", ckpt_.dir(), ": tensor '", name,
                 "': the fused experts have different values (one per tensor is supported)");
    return values[0];
  }
  void require_divisible(int64_t cols, int64_t block, const char* format) const {
    XMOE_CHECK(cols % block == 0, "checkpoint ", ckpt_.dir(), ": quantized weight '", linear_, "' has ", cols,
               " input columns, not a multiple of ", format, "'s block of ", block);
  }

 private:
  const Checkpoint& ckpt_;
  std::string linear_;
  int64_t count_;
};

PackedWeight view(WeightFormat format, int64_t rows, int64_t cols, const WeightView& data,
                  ScaleType scale_type, const WeightView& scales, int64_t scale_stride, int block_rows,
                  int block_cols) {
  PackedWeight w;
  w.format = format;
  w.rows = rows;
  w.cols = cols;
  w.data = data.bytes.data();
  w.row_bytes = static_cast<int64_t>(data.bytes.size()) / rows;
  w.scale_type = scale_type;
  w.scales = scales.bytes.data();
  w.scale_row_stride = scale_stride;
  w.block_rows = block_rows;
  w.block_cols = block_cols;
  return w;
}

}  // namespace

bool holds_linear(const Checkpoint& ckpt, const std::string& name) {
  return ckpt.contains(name) || ckpt.contains(name + "_blocks") ||
         ckpt.contains(module_of(name) + ".weight_packed");
}

std::optional<PackedWeight> quantized_view(const Checkpoint& ckpt, const std::string& name, int64_t rows,
                                           int64_t cols, int64_t count) {
  const QuantizationConfig& q = ckpt.quantization();
  const std::string module = module_of(name);
  const Reader r(ckpt, name, count);
  const int64_t all_rows = std::max<int64_t>(count, 1) * rows;
  std::optional<PackedWeight> w;
  switch (q.scheme) {
    case QuantScheme::none:
      break;
    case QuantScheme::fp8_block: {
      if (!ckpt.contains(name) || ckpt.weight(name).dtype != TensorDType::f8_e4m3) break;
      XMOE_CHECK(count == 0 || rows % 128 == 0, "checkpoint ", ckpt.dir(), ": fused FP8 tensor '", name,
                 "' has ", rows, " rows per expert, not a multiple of the 128-row scale block");
      const int64_t sr = (rows + 127) / 128, sc = (cols + 127) / 128;
      const WeightView data = r.get(name, TensorDType::f8_e4m3, {rows, cols}, "the E4M3 codes");
      const WeightView scales =
          r.get(module + ".weight_scale_inv", TensorDType::f32, {sr, sc}, "the 128x128 block scales");
      if (q.ue8m0_scales) {
        for (int64_t i = 0; i < static_cast<int64_t>(scales.bytes.size() / 4); ++i) {
          float s;
          std::memcpy(&s, scales.bytes.data() + 4 * i, 4);
          int e;
          XMOE_CHECK(s > 0 && std::frexp(s, &e) == 0.5f, "checkpoint ", ckpt.dir(), ": tensor '", module,
                     ".weight_scale_inv' element ", i, " is ", s, ", not a power of two as ", q.source,
                     " field 'scale_fmt' = ue8m0 says");
        }
      }
      w = view(WeightFormat::fp8_block, all_rows, cols, data, ScaleType::f32, scales, sc, 128, 128);
      break;
    }
    case QuantScheme::mxfp4: {
      const std::string blocks = name + "_blocks";
      if (!ckpt.contains(blocks)) break;
      r.require_divisible(cols, 32, "MXFP4");
      const WeightView data = r.get(blocks, TensorDType::u8, {rows, cols / 32, 16}, "the E2M1 codes");
      const WeightView scales =
          r.get(name + "_scales", TensorDType::u8, {rows, cols / 32}, "the E8M0 scales of 32-element blocks");
      w = view(WeightFormat::mxfp4, all_rows, cols, data, ScaleType::e8m0, scales, cols / 32, 1, 32);
      break;
    }
    case QuantScheme::nvfp4_modelopt: {
      if (!ckpt.contains(name) || ckpt.weight(name).dtype != TensorDType::u8) break;
      r.require_divisible(cols, 16, "NVFP4");
      const WeightView data = r.get(name, TensorDType::u8, {rows, cols / 2}, "the E2M1 codes");
      const WeightView scales = r.get(module + ".weight_scale", TensorDType::f8_e4m3, {rows, cols / 16},
                                      "the E4M3 scales of 16-element blocks");
      w = view(WeightFormat::nvfp4, all_rows, cols, data, ScaleType::e4m3, scales, cols / 16, 1, 16);
      w->global_scale = r.scalar(module + ".weight_scale_2", "the global scale (weight_scale_2)");
      break;
    }
    case QuantScheme::nvfp4_compressed:
    case QuantScheme::mxfp4_compressed: {
      const std::string packed = module + ".weight_packed";
      if (!ckpt.contains(packed)) break;
      const bool nv = q.scheme == QuantScheme::nvfp4_compressed;
      const int64_t block = nv ? 16 : 32;
      r.require_divisible(cols, block, nv ? "NVFP4" : "MXFP4");
      const WeightView data = r.get(packed, TensorDType::u8, {rows, cols / 2}, "the E2M1 codes");
      const WeightView scales =
          r.get(module + ".weight_scale", nv ? TensorDType::f8_e4m3 : TensorDType::u8, {rows, cols / block},
                nv ? "the E4M3 scales of 16-element blocks" : "the E8M0 scales");
      w = view(nv ? WeightFormat::nvfp4 : WeightFormat::mxfp4, all_rows, cols, data,
               nv ? ScaleType::e4m3 : ScaleType::e8m0, scales, cols / block, 1, static_cast<int>(block));
      if (nv) {
        // compressed-tensors stores the inverse of the multiplier: global_scale = 6·448 / amax.
        const float stored =
            r.scalar(module + ".weight_global_scale", "the global scale (weight_global_scale)");
        XMOE_CHECK(stored > 0 && std::isfinite(stored), "checkpoint ", ckpt.dir(), ": tensor '", module,
                   ".weight_global_scale' is ", stored, "; it must be a positive finite number");
        w->global_scale = 1.0f / stored;
      }
      break;
    }
  }
  if (w) {
    XMOE_CHECK(!q.is_not_converted(module), "checkpoint ", ckpt.dir(), ": '", module, "' is quantized (",
               quant_scheme_name(q.scheme), ") but ", q.source, " lists it as not converted");
    return w;
  }
  // Plain values: quantized codes here mean the config does not describe the checkpoint.
  if (ckpt.contains(name)) {
    const TensorDType f = ckpt.weight(name).dtype;
    XMOE_CHECK(f != TensorDType::f8_e4m3 && f != TensorDType::u8, "checkpoint ", ckpt.dir(), ": tensor '",
               name, "' has dtype ", tensor_dtype_name(f), " (quantized codes), but ",
               q.scheme == QuantScheme::none ? std::string("config.json has no quantization_config")
                                             : q.source + " describes " + quant_scheme_name(q.scheme));
  }
  return std::nullopt;
}

}  // namespace xmoe::llm
