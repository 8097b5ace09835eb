// One table of CPU kernels per instruction-set level, chosen once at start-up (ggml's type-traits pattern).
// Every table entry has a plain reference version (kernels/cpu/reference_*.cpp) that tests compare it with.
#pragma once
#include <cstdint>

#include "kernels/attention.hpp"
#include "kernels/cpu_features.hpp"
#include "kernels/linear_precision.hpp"
#include "kernels/packed_weight.hpp"
#include "xmoe/dtype.hpp"

namespace xmoe::kernels {

// C[m, n] (+)= op(A)[m, k] · op(B)[k, n], row-major with leading dimensions; op(A) = Aᵀ when trans_a (then A
// is stored [k, m]), likewise B. Determinism contract, kept by every variant:
//  * each C element's k-reduction runs in one fixed order that depends only on k's index, never on m, n, the
//    tiling or the thread count, so results are bit-identical for any number of threads;
//  * appending zero-valued k-steps (padded rows in [E, C, M]) leaves every result bit-identical.
// GEMM runs OpenMP threads itself; every other kernel is single-threaded and callers split rows over threads.
template <class In, class Out>
struct GemmArgs {
  int64_t m = 0, n = 0, k = 0;
  const In* a = nullptr;
  int64_t lda = 0;
  bool trans_a = false;
  const In* b = nullptr;
  int64_t ldb = 0;
  bool trans_b = false;
  Out* c = nullptr;
  int64_t ldc = 0;
  bool accumulate = false;  // C += op(A)·op(B) instead of C = op(A)·op(B)
};

enum class Activation { identity, relu, gelu, silu };  // gelu is the exact erf form (torch's default)

struct KernelTable {
  Isa isa = Isa::reference;
  // What linear[bf16] computes in (linear_precision.hpp); every other entry is the same under either.
  MatmulPrecision precision = MatmulPrecision::highest;
  void (*gemm_f32)(const GemmArgs<float, float>&) = nullptr;
  void (*gemm_bf16)(const GemmArgs<bf16, float>&) = nullptr;  // bf16 inputs, f32 accumulation and output
  void (*gemm_f64)(const GemmArgs<double, double>&) = nullptr;

  // out[r, :] = softmax(in[r, :]); in == out allowed.
  void (*softmax_rows_f32)(const float* in, float* out, int64_t rows, int64_t cols) = nullptr;
  // out[r, c] = act(in[r, c] + bias[c]); bias may be null; in == out allowed.
  void (*bias_act_f32)(Activation act, const float* in, const float* bias, float* out, int64_t rows,
                       int64_t cols) = nullptr;
  // din[i] = dout[i] · act'(pre[i]), pre being the activation's input; din == dout allowed.
  void (*act_backward_f32)(Activation act, const float* pre, const float* dout, float* din,
                           int64_t n) = nullptr;
  // SwiGLU: out = silu(g) ⊙ u, and its backward.
  void (*silu_mul_f32)(const float* g, const float* u, float* out, int64_t n) = nullptr;
  void (*silu_mul_backward_f32)(const float* g, const float* u, const float* dout, float* dg, float* du,
                                int64_t n) = nullptr;

  void (*f32_to_bf16)(const float* in, bf16* out, int64_t n) = nullptr;  // round to nearest even
  void (*bf16_to_f32)(const bf16* in, float* out, int64_t n) = nullptr;

  // Row operations of dispatch/combine.
  void (*scale_f32)(float a, const float* x, float* y, int64_t n) = nullptr;     // y = a·x
  void (*axpy_f32)(float a, const float* x, float* y, int64_t n) = nullptr;      // y += a·x
  float (*dot_f32)(const float* a, const float* b, int64_t n) = nullptr;         // fixed-order lane sums
  void (*scale_bf16)(float a, const bf16* x, bf16* y, int64_t n) = nullptr;      // y = bf16(a·x)
  void (*axpy_bf16_f32)(float a, const bf16* x, float* y, int64_t n) = nullptr;  // y += a·f32(x)
  float (*dot_bf16_f32)(const bf16* a, const float* b, int64_t n) = nullptr;

  // Routing's top-k: for each row r of scores [rows, cols], its k best column indices in descending score
  // order go to ids[j · ids_stride + r], j = 0..k−1 (Tutel's choice-major [k, T] layout with ids_stride = T).
  // Order: NaN above +inf above every number above −inf (as torch.topk); −0 == +0; equal scores (NaNs among
  // themselves too) go to the lower column index. 1 ≤ k ≤ cols (the reference checks it; the others assume
  // it). Every variant returns the reference's ids exactly.
  void (*topk_rows_f32)(const float* scores, int64_t rows, int64_t cols, int k, int32_t* ids,
                        int64_t ids_stride) = nullptr;

  // One work item of causal attention over a paged K/V cache (attention.hpp; kernels::attention threads
  // over the items of a call).
  AttentionTileFn attention_tile = nullptr;

  // Linear layers over a weight in any format (packed_weight.hpp), indexed by WeightFormat: f32 activations,
  // weights decoded in registers. Every entry has a reference version; a level without its own variant
  // takes the best one below it.
  LinearFn linear[kWeightFormatCount] = {};
};

// The table for one level (throws xmoe::Error if this CPU/OS cannot run it).
const KernelTable& kernel_table(Isa isa, const CpuFeatures& features);
// The table for one level with BF16 linears at `precision`. Levels without bf16 products (avx2, avx512) give
// their highest-precision table, whose `precision` field says so (callers print a notice); the reference
// level emulates medium exactly.
const KernelTable& kernel_table(Isa isa, const CpuFeatures& features, MatmulPrecision precision);
// The best table this CPU and OS support.
const KernelTable& best_kernel_table(const CpuFeatures& features);
const KernelTable& reference_kernel_table();

}  // namespace xmoe::kernels
