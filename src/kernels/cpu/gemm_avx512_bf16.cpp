// AVX512-BF16 GEMM: VDPBF16PS multiplies bf16 pairs and adds both products into f32 lanes, twice the f32 FMA
// rate. Packing lays op(A) and op(B) out as k-pairs (2s, 2s+1); an odd tail pairs with a zero, and a pair
// never straddles a kc block, so every C element is one chain over pairs in ascending k order. The
// instruction treats bf16 denormal inputs as zero, where the reference multiplies them exactly.
#include <immintrin.h>

#include "kernels/cpu/gemm_blocking.hpp"
#include "kernels/cpu/gemm_direct_bt.hpp"
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

// gemm_bt_direct's tiles: 6 rows of B broadcast in place (a k-pair each), NV vectors of packed op(A)ᵀ.
// Each VDPBF16PS takes op(A)'s pair as its first source and B's as its second, as the packed kernel does.
struct DirectBf16 {
  static constexpr int rows = 6, width = 16, max_nv = 4, kpack = 2;
  using Packed = bf16;
  static constexpr int64_t kRowAhead = 64;  // k-slots: 256 bytes of each row

  template <int NV>
  static void run(int64_t depth, const bf16* b, int64_t ldb, int64_t b_rows, const bf16* a, float* ct,
                  int64_t ldct, bool load) {
    constexpr int MR = rows;
    const bf16* row[MR];
    tile_rows(b, ldb, b_rows, row);
    __m512 acc[MR][NV];
    load_tile<16>(acc, ct, ldct, load);
    auto slot = [&](int64_t s, auto pair_of) __attribute__((always_inline)) {
      __m512bh av[NV];
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) av[v] = (__m512bh)_mm512_load_si512(a + (s * NV + v) * 32);
#pragma GCC unroll 32
      for (int i = 0; i < MR; ++i) {
        const __m512bh bv = (__m512bh)_mm512_set1_epi32(pair_of(row[i] + 2 * s));
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], av[v], bv);
      }
    };
    auto whole_pair = [](const bf16* p) {
      int32_t pair;
      std::memcpy(&pair, p, sizeof(pair));
      return pair;
    };
    const int64_t whole = depth / 2;
    for (int64_t s = 0; s < whole; ++s) {
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v)
        _mm_prefetch(reinterpret_cast<const char*>(a + ((s + kPrefetch) * NV + v) * 32), _MM_HINT_T0);
      // B's rows come from memory on the tile's first pass: a line of each, well ahead, every 16 slots.
      if ((s & 15) == 0) {
#pragma GCC unroll 32
        for (int i = 0; i < MR; ++i)
          _mm_prefetch(reinterpret_cast<const char*>(row[i] + 2 * (s + kRowAhead)), _MM_HINT_T0);
      }
      slot(s, whole_pair);
    }
    // An odd depth's last slot: B's value alone, its pair partner zero as packing makes it (the value past
    // it may lie past the end of B).
    if (depth & 1) slot(whole, [](const bf16* p) { return static_cast<int32_t>(p->bits); });
    store_tile<16>(acc, ct, ldct);
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

// op(B) = Bᵀ with 32–512 rows whose vectors of 16 waste at most 8 % of the lanes (and k ≥ 3 rows, as
// direct_bt_applies says): gemm_bt_direct, B's rows read in place instead of packed (the rest pays more for
// the empty lanes than packing B costs: 100 rows ran 3–6 % behind the packed path). Sizes swept on Zen 4, two
// threads, against oneDNN in the same run (process CPU time): op(A)ᵀ blocks of 512 KiB and Cᵀ chunks of 192 B
// rows 1–3 % ahead of 256 KiB and of 64 rows; 6 × 64 tiles with a narrower last panel, not tiles picked per
// row count (12 × 32 at 32 rows ran 1.12× oneDNN where 6 × 32 runs 1.3×; 24 × 16 spilled its row pointers and
// ran at a third of the speed).
constexpr int64_t kDirectMaxRows = 512;

}  // namespace

void gemm_bf16(const GemmArgs<bf16, float>& args) {
  if (direct_bt_applies<DirectBf16>(args, kDirectMaxRows)) return gemm_bt_direct<DirectBf16>(args);
  gemm_blocked<Kernel>(args, kBlocking, kMacsPerPackedElement);
}

}  // namespace xmoe::kernels::avx512_bf16
