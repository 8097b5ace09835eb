// A model weight held in memory in the model's dtype (f32 or bf16), converted once from the checkpoint.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "llm/checkpoint.hpp"
#include "llm/layers/linear_kernels.hpp"
#include "xmoe/dtype.hpp"

namespace xmoe::llm {

// rows × cols row-major (a 1-D weight is 1 × n).
class WeightMatrix {
 public:
  WeightMatrix() = default;
  WeightMatrix(DType dtype, int64_t rows, int64_t cols);
  // Reads `name` from the checkpoint, checking its shape is [rows, cols] (or [cols] when rows is 0).
  static WeightMatrix load(const Checkpoint& ckpt, const std::string& name, DType dtype, int64_t rows,
                           int64_t cols);
  // Copies `view` elements [offset, offset + rows_n · cols) into rows [row0, row0 + rows_n).
  void fill_rows(const WeightView& view, int64_t offset, int64_t row0, int64_t rows_n);

  DType dtype() const { return dtype_; }
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  size_t bytes() const { return static_cast<size_t>(rows_ * cols_) * dtype_size(dtype_); }
  const float* f32() const { return f32_.data(); }
  const bf16* b16() const { return b16_.data(); }
  void row_to_f32(int64_t row, float* out) const;

 private:
  DType dtype_ = DType::f32;
  int64_t rows_ = 0, cols_ = 0;
  std::vector<float> f32_;
  std::vector<bf16> b16_;
};

// y[m, n] (row stride ldy) = x[m, k] (row stride ldx) · Wᵀ with W [n, k] row-major, f32 or bf16; columns of
// y split over OpenMP threads (each output computed by one thread, so results do not depend on the count).
template <class W>
void linear_rows(const LinearKernels& kernels, const float* x, int64_t m, int64_t ldx, const W* w, int64_t n,
                 int64_t k, float* y, int64_t ldy);

// y[m, rows] = x[m, cols] · Wᵀ.
void linear_forward(const LinearKernels& kernels, const WeightMatrix& w, const float* x, int64_t m, float* y);

}  // namespace xmoe::llm
