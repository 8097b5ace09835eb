// Declarations of each instruction-set variant's kernels; kernel_table.cpp assembles them into tables.
// Each namespace's functions live in files compiled with that level's flags only (see CMakeLists.txt).
#pragma once
#include "kernels/kernels.hpp"

#define XMOE_DECLARE_GEMMS                           \
  void gemm_f32(const GemmArgs<float, float>& args); \
  void gemm_bf16(const GemmArgs<bf16, float>& args);

#define XMOE_DECLARE_ELEMENTWISE                                                                      \
  void softmax_rows_f32(const float* in, float* out, int64_t rows, int64_t cols);                     \
  void bias_act_f32(Activation act, const float* in, const float* bias, float* out, int64_t rows,     \
                    int64_t cols);                                                                    \
  void act_backward_f32(Activation act, const float* pre, const float* dout, float* din, int64_t n);  \
  void silu_mul_f32(const float* g, const float* u, float* out, int64_t n);                           \
  void silu_mul_backward_f32(const float* g, const float* u, const float* dout, float* dg, float* du, \
                             int64_t n);                                                              \
  void f32_to_bf16(const float* in, bf16* out, int64_t n);                                            \
  void bf16_to_f32(const bf16* in, float* out, int64_t n);                                            \
  void scale_f32(float a, const float* x, float* y, int64_t n);                                       \
  void axpy_f32(float a, const float* x, float* y, int64_t n);                                        \
  float dot_f32(const float* a, const float* b, int64_t n);                                           \
  void scale_bf16(float a, const bf16* x, bf16* y, int64_t n);                                        \
  void axpy_bf16_f32(float a, const bf16* x, float* y, int64_t n);                                    \
  float dot_bf16_f32(const bf16* a, const float* b, int64_t n);                                       \
  void topk_rows_f32(const float* scores, int64_t rows, int64_t cols, int k, int32_t* ids,            \
                     int64_t ids_stride);                                                             \
  void attention_tile(const AttentionArgs& args, const AttentionItem& item, float* scratch);

// Linear layers over unscaled weight formats (LinearArgs, packed_weight.hpp).
#define XMOE_DECLARE_LINEAR_FLOAT           \
  void linear_f32(const LinearArgs& args);  \
  void linear_bf16(const LinearArgs& args); \
  void linear_f16(const LinearArgs& args);

namespace xmoe::kernels {
namespace reference {
XMOE_DECLARE_GEMMS
void gemm_f64(const GemmArgs<double, double>& args);
XMOE_DECLARE_ELEMENTWISE
XMOE_DECLARE_LINEAR_FLOAT
void linear_bf16_medium(const LinearArgs& args);       // linear_bf16dot.hpp's arithmetic, emulated
void linear_bf16_medium_tile(const LinearArgs& args);  // linear_bf16tile.hpp's (the AMX level's), emulated
}  // namespace reference
namespace avx2 {
XMOE_DECLARE_GEMMS
XMOE_DECLARE_ELEMENTWISE
XMOE_DECLARE_LINEAR_FLOAT
}  // namespace avx2
namespace avx512 {
// gemm_f32 / gemm_bf16 below keep op(B) blocks sized for L3 (tuned on Zen 4); these are the same kernels with
// op(B) blocks that stay in L2 (gemm_avx512.cpp gives the figures), for CPUs with an L2 of at least 2 MiB
// (kernel_table.cpp).
void gemm_f32_l2_blocks(const GemmArgs<float, float>& args);
void gemm_bf16_l2_blocks(const GemmArgs<bf16, float>& args);
XMOE_DECLARE_GEMMS
XMOE_DECLARE_ELEMENTWISE
XMOE_DECLARE_LINEAR_FLOAT
}  // namespace avx512
namespace avx512_bf16 {
void gemm_bf16(const GemmArgs<bf16, float>& args);  // VDPBF16PS microkernel
void linear_bf16_medium(const LinearArgs& args);    // the `medium` precision's BF16 linear (VDPBF16PS)
// The same, its decode of one x row reading the weights without software prefetches (AMD: see the .cpp)
void linear_bf16_medium_hardware_prefetch(const LinearArgs& args);
}  // namespace avx512_bf16
namespace amx {
void gemm_bf16(const GemmArgs<bf16, float>& args);  // TDPBF16PS tiles (linear_bf16tile.hpp's arithmetic)
void linear_bf16_medium(const LinearArgs& args);    // the AMX level's `medium` BF16 linear (TDPBF16PS)
}  // namespace amx
}  // namespace xmoe::kernels
