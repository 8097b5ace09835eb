// AVX-512 f32 GEMM: an 8 × 48 register tile (24 zmm accumulators) fed by broadcasts of packed op(A) and three
// vector loads of packed op(B) per k. bf16 inputs are widened to f32 while packing and use the same kernel.
#include <immintrin.h>

#include "kernels/cpu/gemm_blocking.hpp"
#include "kernels/cpu/variants.hpp"

namespace xmoe::kernels::avx512 {
namespace {

constexpr int64_t kPrefetch = 8;  // k-slots ahead (measured on Zen 4: 4 and 16 were slower)

template <int MR, int NV>
struct KernelF32 {
  static constexpr int mr = MR, nr = 16 * NV, kpack = 1;
  using Packed = float;

  static void run(int64_t slots, const float* a, const float* b, float* c, int64_t ldc, int64_t rows,
                  int64_t cols, bool load_c, SourcePrefetch* source) {
    __mmask16 mask[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      const int64_t rem = cols - 16 * v;
      mask[v] = rem >= 16 ? __mmask16(0xffff) : rem <= 0 ? __mmask16(0) : __mmask16((1u << rem) - 1);
    }
    __m512 acc[MR][NV];
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v)
        acc[i][v] =
            load_c && i < rows ? _mm512_maskz_loadu_ps(mask[v], c + i * ldc + 16 * v) : _mm512_setzero_ps();
    }
    for (int64_t s = 0; s < slots; ++s) {
      // The packed panels outgrow L1 at this kc; fetching a few slots ahead keeps the FMAs fed from L2.
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v)
        _mm_prefetch(reinterpret_cast<const char*>(b + (s + kPrefetch) * nr + 16 * v), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(a + (s + kPrefetch) * MR), _MM_HINT_T0);
      if (source && (s & 1)) source->step();
      __m512 bv[NV];
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) bv[v] = _mm512_load_ps(b + s * nr + 16 * v);
#pragma GCC unroll 16
      for (int i = 0; i < MR; ++i) {
        const __m512 av = _mm512_set1_ps(a[s * MR + i]);
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_fmadd_ps(av, bv[v], acc[i][v]);
      }
    }
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      if (i >= rows) break;
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) _mm512_mask_storeu_ps(c + i * ldc + 16 * v, mask[v], acc[i][v]);
    }
  }
};

// 8 × 48 (24 accumulators): the experts' row counts (64–512 tokens) are whole multiples of 8, where 14 rows
// left the last tile of 64 rows 3/7 empty and of 128 rows 6/7; and on Zen 4 (one-thread CPU time,
// interleaved) it ran 64–256 × 2048 × 2048 NT 5–12 % and 8192 × 2048 × 2048 0–3 % ahead of 14 × 32, with
// 16 × 16, 12 × 32, 8 × 32 and 6 × 64 in between.
using Kernel = KernelF32<8, 3>;
// Few rows (up to 512, as in gemm_avx2.cpp): nc_small 64 (rounded to 96 here; one 192 KiB op(B) block)
// measured ahead of 128 and 2048 at 64–256 × 2048 × 2048 with the 14 × 32 tile. For op(B) = Bᵀ 1024 × 48 ran
// 128–256 × 2048 × 2048 NT 3–8 % ahead of 512 × 96 (level at 64 rows; 512 × 48, 1024 × 96 and 256 × 192 in
// between).
// Two threads (process CPU time per thread, interleaved): splitting columns up to 512 rows took 64–512 ×
// 2048 × 2048 from 0.55–0.96× oneDNN to 0.92–1.1× (the shared tall path left 32 rows a thread at 64).
// Tiles rows outer (as at AVX2; the 8 × 512 op(A) micro-panel is 16 KiB, the 512 × 48 op(B) one 96 KiB, more
// than L1): ratio to the best peer 1.01 → 1.08–1.10 at 2048 × 2048 × 64 TN, 0.96–0.98 → 1.01 at 2048³ NT,
// 1.01 → 1.03 at 512 × 2048 × 2048 NN, 1.04–1.05 → 1.05–1.09 at 8192 × 2048 × 2048 NN, level at 64–512 NT.
// (At VDPBF16PS it measured level, within 1–2 %, so that level keeps the old order.)
constexpr GemmBlocking kBlocking{.mc = 8 * 21,
                                 .kc = 512,
                                 .nc = 2048,
                                 .mc_once = 512,
                                 .kc_once = 512,
                                 .nc_small = 64,
                                 .kc_once_tb = 1024,
                                 .nc_small_tb = 48,
                                 .split_rows = 512,
                                 .rows_outer = true};
constexpr int kMacsPerPackedElement = 16;

}  // namespace

void gemm_f32(const GemmArgs<float, float>& args) {
  gemm_blocked<Kernel>(args, kBlocking, kMacsPerPackedElement);
}

void gemm_bf16(const GemmArgs<bf16, float>& args) {
  gemm_blocked<Kernel>(args, kBlocking, kMacsPerPackedElement);
}

}  // namespace xmoe::kernels::avx512
