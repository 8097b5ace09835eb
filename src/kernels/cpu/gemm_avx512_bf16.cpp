// AVX512-BF16 GEMM: VDPBF16PS multiplies bf16 pairs and adds both products into f32 lanes, twice the f32 FMA
// rate. Packing lays op(A) and op(B) out as k-pairs (2s, 2s+1); an odd tail pairs with a zero, and a pair
// never straddles a kc block, so every C element is one chain over pairs in ascending k order. The
// instruction treats bf16 denormal inputs as zero, where the reference multiplies them exactly.
#include <immintrin.h>

#include "kernels/cpu/gemm_blocking.hpp"
#include "kernels/cpu/variants.hpp"

namespace xmoe::kernels::avx512_bf16 {
namespace {

constexpr int64_t kPrefetch = 8;  // k-pair slots ahead

template <int MR, int NV>
struct KernelBf16 {
  static constexpr int mr = MR, nr = 16 * NV, kpack = 2;
  using Packed = bf16;

  static void run(int64_t slots, const bf16* a, const bf16* b, float* c, int64_t ldc, int64_t rows,
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
      // The packed panels outgrow L1 at this kc; fetching a few slots ahead keeps the dot products fed from
      // L2.
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v)
        _mm_prefetch(reinterpret_cast<const char*>(b + ((s + kPrefetch) * NV + v) * 32), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(a + (s + kPrefetch) * MR * 2), _MM_HINT_T0);
      if (source && (s & 1)) source->step();
      __m512bh bv[NV];
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) bv[v] = (__m512bh)_mm512_load_si512(b + (s * NV + v) * 32);
#pragma GCC unroll 16
      for (int i = 0; i < MR; ++i) {
        int32_t pair;
        std::memcpy(&pair, a + (s * MR + i) * 2, sizeof(pair));
        const __m512bh av = (__m512bh)_mm512_set1_epi32(pair);
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], av, bv[v]);
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

// 6 × 64 measured a few percent ahead of 14 × 32 here (fewer broadcasts per dot product) and wastes less of a
// small token block.
using Kernel = KernelBf16<6, 4>;
// Few rows: up to 512 rows (as in gemm_avx2.cpp) in one op(A) block, 512 KiB at 256 rows, op(B) in 256 KiB
// blocks (at 64–256 × 2048 × 2048 from 0.56–0.77× oneDNN to 0.81–1.0×; kc_once 512 and nc_small 256 measured
// behind).
// Two threads: splitting columns up to 512 rows took 128 × 2048 × 2048 NT from 0.82× to 0.96× oneDNN and
// 512 NT/NN 2–4 % ahead (process CPU time per thread, interleaved).
constexpr GemmBlocking kBlocking{.mc = 6 * 12,
                                 .kc = 1024,
                                 .nc = 2048,
                                 .mc_once = 512,
                                 .kc_once = 1024,
                                 .nc_small = 128,
                                 .split_rows = 512};
constexpr int kMacsPerPackedElement = 32;

}  // namespace

void gemm_bf16(const GemmArgs<bf16, float>& args) {
  gemm_blocked<Kernel>(args, kBlocking, kMacsPerPackedElement);
}

}  // namespace xmoe::kernels::avx512_bf16
