#include "llm/layers/weights.hpp"

#include <omp.h>

#include "kernels/linear.hpp"
#include "llm/layers/quantized_views.hpp"
#include "xmoe/error.hpp"

namespace xmoe::llm {

namespace {

kernels::WeightFormat format_of(TensorDType t) {
  switch (t) {
    case TensorDType::f32:
      return kernels::WeightFormat::f32;
    case TensorDType::bf16:
      return kernels::WeightFormat::bf16;
    case TensorDType::f16:
      return kernels::WeightFormat::f16;
    default:
      break;
  }
  throw Error("weights: dtype holds quantized codes, not values");
}

}  // namespace

WeightLoader::WeightLoader(const Checkpoint& ckpt, DType dtype) : ckpt_(ckpt), dtype_(dtype) {
  XMOE_CHECK(dtype == DType::f32 || dtype == DType::bf16, "weights: dtype must be float32 or bfloat16, got ",
             dtype_name(dtype));
}

kernels::PackedWeight WeightLoader::convert_or_map(const WeightView& view, int64_t rows, int64_t cols) {
  kernels::PackedWeight w;
  w.rows = rows;
  w.cols = cols;
  const bool in_place =
      dtype_ == DType::f32 ? view.dtype == TensorDType::f32 : view.dtype != TensorDType::f32;
  if (in_place) {
    w.format = format_of(view.dtype);
    w.data = view.bytes.data();
    w.row_bytes = static_cast<int64_t>(view.bytes.size()) / rows;
    return w;
  }
  // The conversion runs over row blocks in parallel: page faults of the mapping and of the new buffer
  // dominate it.
  const size_t esize = dtype_ == DType::f32 ? 4 : 2;
  const size_t n = static_cast<size_t>(rows * cols) * esize;
  owned_.push_back(std::make_unique_for_overwrite<std::byte[]>(n));
  std::byte* dst = owned_.back().get();
  owned_bytes_ += n;
  const int64_t block = 1 << 16, count = rows * cols;
#pragma omp parallel for schedule(static) if (count > block)
  for (int64_t b = 0; b < count; b += block) {
    const int64_t len = std::min(block, count - b);
    if (dtype_ == DType::f32)
      view.to_f32(b, len, reinterpret_cast<float*>(dst) + b);
    else
      view.to_bf16(b, len, reinterpret_cast<uint16_t*>(dst) + b);
  }
  w.format = dtype_ == DType::f32 ? kernels::WeightFormat::f32 : kernels::WeightFormat::bf16;
  w.data = dst;
  w.row_bytes = cols * static_cast<int64_t>(esize);
  return w;
}

kernels::PackedWeight WeightLoader::with_nan_flags(kernels::PackedWeight w) {
  if (w.format != kernels::WeightFormat::fp8_block) return w;
  nan_flags_.push_back(std::make_unique<std::atomic<uint8_t>[]>(static_cast<size_t>(w.rows)));  // all 0
  w.nan_free_rows = nan_flags_.back().get();
  return w;
}

kernels::PackedWeight WeightLoader::matrix(const std::string& name, int64_t rows, int64_t cols) {
  if (auto q = quantized_view(ckpt_, name, rows > 0 ? rows : 1, cols)) {
    checkpoint_bytes_ += q->bytes();
    return with_nan_flags(*q);
  }
  std::vector<int64_t> shape;
  if (rows > 0) shape.push_back(rows);
  shape.push_back(cols);
  const WeightView view = ckpt_.weight(name, shape);
  checkpoint_bytes_ += view.bytes.size();
  return convert_or_map(view, rows > 0 ? rows : 1, cols);
}

std::vector<kernels::PackedWeight> WeightLoader::stacked(const std::string& name, int64_t count, int64_t rows,
                                                         int64_t cols) {
  const int64_t shape[] = {count, rows, cols};
  std::optional<kernels::PackedWeight> all = quantized_view(ckpt_, name, rows, cols, count);
  if (all) {
    checkpoint_bytes_ += all->bytes();
    all = with_nan_flags(*all);
  } else {
    const WeightView view = ckpt_.weight(name, shape);
    checkpoint_bytes_ += view.bytes.size();
    all = convert_or_map(view, count * rows, cols);
  }
  std::vector<kernels::PackedWeight> slices;
  for (int64_t e = 0; e < count; ++e) slices.push_back(kernels::slice_rows(*all, e * rows, rows));
  return slices;
}

std::vector<float> load_vector(const Checkpoint& ckpt, const std::string& name, int64_t n) {
  const int64_t shape[] = {n};
  const WeightView view = ckpt.weight(name, shape);
  std::vector<float> out(static_cast<size_t>(n));
  view.to_f32(0, n, out.data());
  return out;
}

}  // namespace xmoe::llm
