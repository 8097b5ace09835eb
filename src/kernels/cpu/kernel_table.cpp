#include "kernels/cpu/linear_quant.hpp"
#include "kernels/cpu/linear_quant_bf16dot.hpp"
#include "kernels/cpu/linear_quant_bf16tile.hpp"
#include "kernels/cpu/variants.hpp"
#include "xmoe/error.hpp"

namespace xmoe::kernels {

namespace {

#define XMOE_FILL_ELEMENTWISE(ns)                         \
  t.softmax_rows_f32 = ns::softmax_rows_f32;              \
  t.bias_act_f32 = ns::bias_act_f32;                      \
  t.act_backward_f32 = ns::act_backward_f32;              \
  t.silu_mul_f32 = ns::silu_mul_f32;                      \
  t.silu_mul_backward_f32 = ns::silu_mul_backward_f32;    \
  t.f32_to_bf16 = ns::f32_to_bf16;                        \
  t.bf16_to_f32 = ns::bf16_to_f32;                        \
  t.scale_f32 = ns::scale_f32;                            \
  t.axpy_f32 = ns::axpy_f32;                              \
  t.dot_f32 = ns::dot_f32;                                \
  t.scale_bf16 = ns::scale_bf16;                          \
  t.axpy_bf16_f32 = ns::axpy_bf16_f32;                    \
  t.dot_bf16_f32 = ns::dot_bf16_f32;                      \
  t.topk_rows_f32 = ns::topk_rows_f32;                    \
  t.attention_tile = ns::attention_tile;                  \
  t.linear[size_t(WeightFormat::f32)] = ns::linear_f32;   \
  t.linear[size_t(WeightFormat::bf16)] = ns::linear_bf16; \
  t.linear[size_t(WeightFormat::f16)] = ns::linear_f16;

// The block-quantized formats' linears (kernels/cpu/linear_quant_*.cpp).
#define XMOE_FILL_QUANT_LINEARS(ns)                                           \
  t.linear[static_cast<int>(WeightFormat::fp8_block)] = ns::linear_fp8_block; \
  t.linear[static_cast<int>(WeightFormat::mxfp4)] = ns::linear_mxfp4;         \
  t.linear[static_cast<int>(WeightFormat::nvfp4)] = ns::linear_nvfp4;

KernelTable make_reference() {
  KernelTable t;
  t.isa = Isa::reference;
  t.gemm_f32 = reference::gemm_f32;
  t.gemm_bf16 = reference::gemm_bf16;
  t.gemm_f64 = reference::gemm_f64;
  XMOE_FILL_ELEMENTWISE(reference)
  XMOE_FILL_QUANT_LINEARS(reference)
  return t;
}

KernelTable make_avx2() {
  KernelTable t;
  t.isa = Isa::avx2;
  t.gemm_f32 = avx2::gemm_f32;
  t.gemm_bf16 = avx2::gemm_bf16;
  t.gemm_f64 = reference::gemm_f64;
  XMOE_FILL_ELEMENTWISE(avx2)
  XMOE_FILL_QUANT_LINEARS(avx2)
  return t;
}

// The AVX-512 f32 GEMM keeps its op(B) blocks in L2 where L2 has at least 2 MiB (Sapphire Rapids and later
// Xeons, whose mesh L3 cannot feed the 4 MiB blocks): Zen 4's 1 MiB keeps the L3 blocks it was tuned with
// (Ice Lake's 1.25 MiB too: not measured). gemm_avx512.cpp gives the figures.
bool gemm_blocks_in_l2(const CpuFeatures& f) {
  return f.l2_bytes >= (int64_t{2} << 20);
}

// l2_blocks: the f32 GEMM's op(B) blocks sized for L2 (gemm_blocks_in_l2).
KernelTable make_avx512(bool l2_blocks) {
  KernelTable t;
  t.isa = Isa::avx512;
  t.gemm_f32 = l2_blocks ? avx512::gemm_f32_l2_blocks : avx512::gemm_f32;
  t.gemm_bf16 = l2_blocks ? avx512::gemm_bf16_l2_blocks : avx512::gemm_bf16;
  t.gemm_f64 = reference::gemm_f64;
  XMOE_FILL_ELEMENTWISE(avx512)
  XMOE_FILL_QUANT_LINEARS(avx512)
  return t;
}

KernelTable make_avx512_bf16(bool l2_blocks) {
  KernelTable t = make_avx512(l2_blocks);
  t.isa = Isa::avx512_bf16;
  t.gemm_bf16 = avx512_bf16::gemm_bf16;
  return t;
}

// AMX: the bf16 GEMM on tiles; every other kernel is the AVX512-BF16 level's, plus (kernel_table below) the
// medium precision's BF16 linear.
KernelTable make_amx(bool l2_blocks) {
  KernelTable t = make_avx512_bf16(l2_blocks);
  t.isa = Isa::amx;
  t.gemm_bf16 = amx::gemm_bf16;
  return t;
}

// The same table with BF16 linears at the medium precision. `amd`: the AVX512-BF16 quantized linears' decode
// tiles tuned on Zen 4 (linear_quant_bf16dot_avx512_bf16.cpp).
KernelTable with_medium_bf16(KernelTable t, LinearFn linear_bf16_medium, bool amd) {
  t.precision = MatmulPrecision::medium;
  t.linear[size_t(WeightFormat::bf16)] = linear_bf16_medium;
  // Block-quantized weights at medium: bf16 products of the codes, scales on x (FP8), on the codes (MXFP4) or
  // on the f32 partial sums (NVFP4).
  const bool emulated = t.isa == Isa::reference;
  t.linear[size_t(WeightFormat::fp8_block)] = emulated ? reference::linear_fp8_block_medium
                                              : amd    ? avx512_bf16::linear_fp8_block_medium_wide_decode
                                                       : avx512_bf16::linear_fp8_block_medium;
  t.linear[size_t(WeightFormat::mxfp4)] = emulated ? reference::linear_mxfp4_medium
                                          : amd    ? avx512_bf16::linear_mxfp4_medium_wide_decode
                                                   : avx512_bf16::linear_mxfp4_medium;
  t.linear[size_t(WeightFormat::nvfp4)] = emulated ? reference::linear_nvfp4_medium
                                          : amd    ? avx512_bf16::linear_nvfp4_medium_wide_decode
                                                   : avx512_bf16::linear_nvfp4_medium;
  return t;
}

// The AVX512-BF16 level's medium table in the forms for AMD CPUs (`amd`: the decode of one x row streams BF16
// weights with the hardware prefetchers alone, linear_bf16dot_avx512_bf16.cpp, and quantized ones in wider
// tiles, linear_quant_bf16dot_avx512_bf16.cpp) or for the others.
KernelTable avx512_bf16_medium_table(bool l2_blocks, bool amd) {
  return with_medium_bf16(
      make_avx512_bf16(l2_blocks),
      amd ? avx512_bf16::linear_bf16_medium_hardware_prefetch : avx512_bf16::linear_bf16_medium, amd);
}

// The AMX level's medium table: FP8 and MXFP4 weights on tiles too (NVFP4 keeps VDPBF16PS's kernel:
// linear_mxfp4_bf16tile_amx.cpp says why).
KernelTable with_amx_tiles(KernelTable t) {
  t.linear[size_t(WeightFormat::fp8_block)] = amx::linear_fp8_block_medium;
  t.linear[size_t(WeightFormat::mxfp4)] = amx::linear_mxfp4_medium;
  return t;
}

#undef XMOE_FILL_ELEMENTWISE
#undef XMOE_FILL_QUANT_LINEARS

}  // namespace

const KernelTable& reference_kernel_table() {
  static const KernelTable table = make_reference();
  return table;
}

const KernelTable& kernel_table(Isa isa, const CpuFeatures& features) {
  XMOE_CHECK(isa_supported(features, isa), "isa: ", isa_name(isa), " is not supported by this CPU/OS (",
             features.str(), ")");
  static const KernelTable avx2_table = make_avx2();
  // Each AVX-512 level's table with the f32 GEMM's op(B) blocks sized for L3 and for L2.
  static const KernelTable avx512_tables[2] = {make_avx512(false), make_avx512(true)};
  static const KernelTable avx512_bf16_tables[2] = {make_avx512_bf16(false), make_avx512_bf16(true)};
  static const KernelTable amx_tables[2] = {make_amx(false), make_amx(true)};
  const int l2 = gemm_blocks_in_l2(features) ? 1 : 0;
  switch (isa) {
    case Isa::reference:
      return reference_kernel_table();
    case Isa::avx2:
      return avx2_table;
    case Isa::avx512:
      return avx512_tables[l2];
    case Isa::avx512_bf16:
      return avx512_bf16_tables[l2];
    case Isa::amx:
      return amx_tables[l2];
  }
  return reference_kernel_table();
}

const KernelTable& kernel_table(Isa isa, const CpuFeatures& features, MatmulPrecision precision) {
  const KernelTable& highest = kernel_table(isa, features);
  if (precision == MatmulPrecision::highest) return highest;
  static const KernelTable reference_medium =
      with_medium_bf16(reference_kernel_table(), reference::linear_bf16_medium, false);
  static const KernelTable avx512_bf16_medium[2][2] = {
      // [L2 blocks][AMD]
      {avx512_bf16_medium_table(false, false), avx512_bf16_medium_table(false, true)},
      {avx512_bf16_medium_table(true, false), avx512_bf16_medium_table(true, true)}};
  // AMX: BF16, FP8 and MXFP4 linears in TDPBF16PS's arithmetic (linear_bf16tile.hpp,
  // linear_quant_bf16tile.hpp).
  static const KernelTable amx_medium[2] = {
      with_amx_tiles(with_medium_bf16(make_amx(false), amx::linear_bf16_medium, false)),
      with_amx_tiles(with_medium_bf16(make_amx(true), amx::linear_bf16_medium, false))};
  const int l2 = gemm_blocks_in_l2(features) ? 1 : 0;
  switch (highest.isa) {
    case Isa::reference:
      return reference_medium;
    case Isa::avx512_bf16:
      return avx512_bf16_medium[l2][features.amd ? 1 : 0];
    case Isa::amx:
      return amx_medium[l2];
    case Isa::avx2:
    case Isa::avx512:
      break;
  }
  return highest;
}

const KernelTable& best_kernel_table(const CpuFeatures& features) {
  return kernel_table(best_isa(features), features);
}

}  // namespace xmoe::kernels
