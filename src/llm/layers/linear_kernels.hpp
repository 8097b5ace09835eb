// Matrix-vector style kernels of the model's linear layers: y[i, j] = Σ_p x[i, p]·W[j, p] with x f32 rows and
// W [n, k] row-major in f32 or bf16 (Hugging Face nn.Linear layout, read in place).
//
// Decode multiplies a few rows by a large weight, so the kernels stream each weight row once per block of
// x rows instead of packing it (the GEMM packs op(B) on every call, which at m = 1 costs more than the
// product). Determinism: every output is one dot product whose summation order depends only on k (16 lanes
// over p mod 16, then a fixed reduction), never on m, n, the block it falls in or the thread count, so a
// sequence's results do not depend on what else is in the batch.
#pragma once
#include <cstdint>

#include "kernels/cpu_features.hpp"
#include "xmoe/dtype.hpp"

namespace xmoe::llm {

// Computes the columns [n0, n1) of y for all m rows (single-threaded; callers split columns over threads).
template <class W>
using LinearFn = void (*)(const float* x, int64_t m, int64_t ldx, const W* w, int64_t k, int64_t n0,
                          int64_t n1, float* y, int64_t ldy);

struct LinearKernels {
  kernels::Isa isa = kernels::Isa::reference;
  LinearFn<float> f32 = nullptr;
  LinearFn<bf16> bf16w = nullptr;
};

// The best variant at or below `isa` (reference for levels without a variant of their own).
const LinearKernels& linear_kernels(kernels::Isa isa);
const LinearKernels& reference_linear_kernels();

namespace linear_reference {
void f32(const float* x, int64_t m, int64_t ldx, const float* w, int64_t k, int64_t n0, int64_t n1, float* y,
         int64_t ldy);
void bf16w(const float* x, int64_t m, int64_t ldx, const bf16* w, int64_t k, int64_t n0, int64_t n1, float* y,
           int64_t ldy);
}  // namespace linear_reference

namespace linear_avx2 {
void f32(const float* x, int64_t m, int64_t ldx, const float* w, int64_t k, int64_t n0, int64_t n1, float* y,
         int64_t ldy);
void bf16w(const float* x, int64_t m, int64_t ldx, const bf16* w, int64_t k, int64_t n0, int64_t n1, float* y,
           int64_t ldy);
}  // namespace linear_avx2

namespace linear_avx512 {
void f32(const float* x, int64_t m, int64_t ldx, const float* w, int64_t k, int64_t n0, int64_t n1, float* y,
         int64_t ldy);
void bf16w(const float* x, int64_t m, int64_t ldx, const bf16* w, int64_t k, int64_t n0, int64_t n1, float* y,
           int64_t ldy);
}  // namespace linear_avx512

}  // namespace xmoe::llm
