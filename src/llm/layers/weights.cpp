#include "llm/layers/weights.hpp"

#include <omp.h>

#include <algorithm>
#include <type_traits>

#include "xmoe/error.hpp"

namespace xmoe::llm {

WeightMatrix::WeightMatrix(DType dtype, int64_t rows, int64_t cols)
    : dtype_(dtype), rows_(rows), cols_(cols) {
  XMOE_CHECK(dtype == DType::f32 || dtype == DType::bf16, "weights: dtype must be float32 or bfloat16, got ",
             dtype_name(dtype));
  const auto n = static_cast<size_t>(rows * cols);
  if (dtype == DType::f32)
    f32_.resize(n);
  else
    b16_.resize(n);
}

WeightMatrix WeightMatrix::load(const Checkpoint& ckpt, const std::string& name, DType dtype, int64_t rows,
                                int64_t cols) {
  std::vector<int64_t> shape;
  if (rows > 0) shape.push_back(rows);
  shape.push_back(cols);
  const WeightView view = ckpt.weight(name, shape);
  WeightMatrix w(dtype, rows > 0 ? rows : 1, cols);
  w.fill_rows(view, 0, 0, w.rows_);
  return w;
}

void WeightMatrix::fill_rows(const WeightView& view, int64_t offset, int64_t row0, int64_t rows_n) {
  XMOE_CHECK(row0 >= 0 && row0 + rows_n <= rows_ && offset >= 0 && offset + rows_n * cols_ <= view.numel(),
             "weights: ", view.name, ": rows out of range");
  const int64_t n = rows_n * cols_;
  if (dtype_ == DType::f32)
    view.to_f32(offset, n, f32_.data() + row0 * cols_);
  else
    view.to_bf16(offset, n, reinterpret_cast<uint16_t*>(b16_.data() + row0 * cols_));
}

void WeightMatrix::row_to_f32(int64_t row, float* out) const {
  if (dtype_ == DType::f32) {
    std::copy(f32_.data() + row * cols_, f32_.data() + (row + 1) * cols_, out);
  } else {
    const bf16* r = b16_.data() + row * cols_;
    for (int64_t c = 0; c < cols_; ++c) out[c] = static_cast<float>(r[c]);
  }
}

template <class W>
void linear_rows(const LinearKernels& kernels, const float* x, int64_t m, int64_t ldx, const W* w, int64_t n,
                 int64_t k, float* y, int64_t ldy) {
  if (m == 0 || n == 0) return;
  // Enough work per thread to pay for the team; column blocks are whole multiples of 8 (the kernels' tile).
  const double work = static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  const int threads = static_cast<int>(std::clamp(work / (1 << 16), 1.0, double(omp_get_max_threads())));
  auto run = [&](int64_t n0, int64_t n1) {
    if constexpr (std::is_same_v<W, float>)
      kernels.f32(x, m, ldx, w, k, n0, n1, y, ldy);
    else
      kernels.bf16w(x, m, ldx, w, k, n0, n1, y, ldy);
  };
  if (threads <= 1 || omp_in_parallel()) {
    run(0, n);
    return;
  }
  const int64_t blocks = (n + 7) / 8;
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), team = omp_get_num_threads();
    const int64_t b0 = blocks * t / team, b1 = blocks * (t + 1) / team;
    if (b1 > b0) run(b0 * 8, std::min(n, b1 * 8));
  }
}

template void linear_rows<float>(const LinearKernels&, const float*, int64_t, int64_t, const float*, int64_t,
                                 int64_t, float*, int64_t);
template void linear_rows<bf16>(const LinearKernels&, const float*, int64_t, int64_t, const bf16*, int64_t,
                                int64_t, float*, int64_t);

void linear_forward(const LinearKernels& kernels, const WeightMatrix& w, const float* x, int64_t m,
                    float* y) {
  if (w.dtype() == DType::f32)
    linear_rows(kernels, x, m, w.cols(), w.f32(), w.rows(), w.cols(), y, w.rows());
  else
    linear_rows(kernels, x, m, w.cols(), w.b16(), w.rows(), w.cols(), y, w.rows());
}

}  // namespace xmoe::llm
