// AVX2 f32 GEMM: a 6 × 16 register tile (12 ymm accumulators), the classic Haswell/Zen shape that leaves room
// for two op(B) vectors and one broadcast. bf16 inputs are widened to f32 while packing and use the same
// kernel.
#include <immintrin.h>

#include "kernels/cpu/gemm_blocking.hpp"
#include "kernels/cpu/gemm_direct_bt.hpp"
#include "kernels/cpu/variants.hpp"

namespace xmoe::kernels::avx2 {
namespace {

constexpr int64_t kPrefetch = 8;  // k-slots of packed op(B) fetched ahead (one 64-byte line per slot)

template <int MR, int NV>
struct KernelF32 {
  static constexpr int mr = MR, nr = 8 * NV, kpack = 1;
  using Packed = float;

  // An edge tile of at most 2 or 4 rows multiplies only those (op(A)'s panel keeps its MR stride): the
  // zero rows past them were a third of the last tile's FMAs at 64 rows and two thirds at 128, 3 % of the
  // product.
  static void run(int64_t slots, const float* a, const float* b, float* c, int64_t ldc, int64_t rows,
                  int64_t cols, bool load_c, SourcePrefetch* source) {
    if (MR > 2 && rows <= 2) return tile<2>(slots, a, b, c, ldc, rows, cols, load_c, source);
    if (MR > 4 && rows <= 4) return tile<4>(slots, a, b, c, ldc, rows, cols, load_c, source);
    tile<MR>(slots, a, b, c, ldc, rows, cols, load_c, source);
  }

  // The first R rows of the tile.
  template <int R>
  static void tile(int64_t slots, const float* a, const float* b, float* c, int64_t ldc, int64_t rows,
                   int64_t cols, bool load_c, SourcePrefetch* source) {
    // Masks are made where they are used: live across the k loop below they took two of the sixteen ymm
    // registers, and GCC spilled inside the loop.
    auto mask = [cols](int v) {
      return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(std::clamp<int64_t>(cols - 8 * v, 0, 8))),
                                _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    };
    // VMASKMOVPS stores are microcoded on AMD cores (many cycles each), so only edge tiles use masks. This,
    // the op(B) prefetch, the unrolled k loop and kc 512 together took 2048³ and the expert shapes from ~80
    // to ~95 GFLOP/s on one Zen 4 core (interleaved A/B, CPU time).
    const bool full = rows == R && cols == nr;
    __m256 acc[R][NV];
#pragma GCC unroll 16
    for (int i = 0; i < R; ++i) {
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v)
        acc[i][v] = !load_c || i >= rows ? _mm256_setzero_ps()
                    : full               ? _mm256_loadu_ps(c + i * ldc + 8 * v)
                                         : _mm256_maskload_ps(c + i * ldc + 8 * v, mask(v));
    }
    auto slot = [&](int64_t s) __attribute__((always_inline)) {
#pragma GCC unroll 8
      for (int v = 0; v < NV; v += 2)
        _mm_prefetch(reinterpret_cast<const char*>(b + (s + kPrefetch) * nr + 8 * v), _MM_HINT_T0);
      __m256 bv[NV];
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) bv[v] = _mm256_load_ps(b + s * nr + 8 * v);
#pragma GCC unroll 16
      for (int i = 0; i < R; ++i) {
        const __m256 av = _mm256_broadcast_ss(a + s * MR + i);
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) acc[i][v] = _mm256_fmadd_ps(av, bv[v], acc[i][v]);
      }
    };
    // The source hook once per pair of k-slots, and a loop without it when there is none: testing `source`
    // and the slot's parity in every slot cost 1–3 % at 64–512 × 2048 × 2048 NN.
    if (source) {
      int64_t s = 0;
#pragma GCC unroll 2
      for (; s + 1 < slots; s += 2) {
        slot(s);
        source->step();
        slot(s + 1);
      }
      if (s < slots) slot(s);
    } else {
#pragma GCC unroll 4
      for (int64_t s = 0; s < slots; ++s) slot(s);
    }
    if (full) {
#pragma GCC unroll 16
      for (int i = 0; i < R; ++i) {
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) _mm256_storeu_ps(c + i * ldc + 8 * v, acc[i][v]);
      }
      return;
    }
#pragma GCC unroll 16
    for (int i = 0; i < R; ++i) {
      if (i >= rows) break;
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) _mm256_maskstore_ps(c + i * ldc + 8 * v, mask(v), acc[i][v]);
    }
  }
};

// gemm_bt_direct's tiles for f32: 6 rows of B broadcast in place, NV vectors of packed op(A)ᵀ; each FMA
// multiplies op(A)'s value by B's, as the packed kernel does. (bf16 operands keep the packed path: widening
// each broadcast value in the k loop ran 64–512 × 2048 × 2048 NT at 64–82 % of the packed path's rate on
// Zen 4, where packing widens each of B's values once for all rows.)
struct DirectF32 {
  static constexpr int rows = 6, width = 8, max_nv = 2, kpack = 1;
  using Packed = float;

  template <int NV>
  static void run(int64_t depth, const float* b, int64_t ldb, int64_t b_rows, const float* a, float* ct,
                  int64_t ldct, bool load) {
    constexpr int MR = rows;
    constexpr int64_t ahead = 64;  // k values: four lines of each row
    const float* row[MR];
    tile_rows(b, ldb, b_rows, row);
    __m256 acc[MR][NV];
    load_tile<8>(acc, ct, ldct, load);
    for (int64_t s = 0; s < depth; ++s) {
      _mm_prefetch(reinterpret_cast<const char*>(a + (s + kPrefetch) * 8 * NV), _MM_HINT_T0);
      // B's rows come from memory on the tile's first pass: a line of each, well ahead.
      if ((s & 15) == 0) {
#pragma GCC unroll 32
        for (int i = 0; i < MR; ++i)
          _mm_prefetch(reinterpret_cast<const char*>(row[i] + s + ahead), _MM_HINT_T0);
      }
      __m256 av[NV];
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) av[v] = _mm256_load_ps(a + s * 8 * NV + 8 * v);
#pragma GCC unroll 32
      for (int i = 0; i < MR; ++i) {
        const __m256 bv = _mm256_broadcast_ss(row[i] + s);
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) acc[i][v] = _mm256_fmadd_ps(av[v], bv, acc[i][v]);
      }
    }
    store_tile<8>(acc, ct, ldct);
  }
};

using Kernel = KernelF32<6, 2>;
// kc = 512 (a 32 KiB op(B) micro-panel, streamed with the prefetch above) measured a few % ahead of 256.
// Few rows (up to 512: at 512 × 2048 × 2048 one thread ran 2–4 % ahead of the tall path, at every level): a
// 512 KiB op(A) block at 256 rows and 256 KiB op(B) blocks (swept on one Zen 4 core at 64–512 × 2048 × 2048:
// nc_small 128 ahead of 64, 192, 256, 512 and 2048; kc_once 512 ahead of 256). For op(B) = Bᵀ, with the
// next block's source prefetched, 2048 × 32 ran 64–256 × 2048 × 2048 NT 3–6 % ahead of 512 × 128 (1024 × 64
// and 2048 × 64 in between; 2048 × 32 on NN ran 15 % behind, its source rows a mere 128 bytes each).
// Tiles run rows outer (each 6 × 512 op(A) micro-panel, 12 KiB, stays in L1 while the op(B) block streams
// past it): one Zen 4 core, gemm_bench interleaved, ratio to the best peer 0.95–0.98 → 0.98–1.00 at
// 64–512 × 2048 × 2048 NN, 0.95–0.97 → 0.97–1.01 at the tall 8192 × 2048 × 2048 NN, 2048 × 2048 × 8192 TN
// and 2048³ NT, level at the TN weight gradients of k = 64, 128 and at NT up to 512 rows.
// Two threads keep the grid model's choice (no split_rows): splitting columns measured level with it at
// 64–128 × 2048 × 2048 and 2–4 % behind at 256–512 rows (process CPU time per thread, interleaved).
constexpr GemmBlocking kBlocking{.mc = 6 * 24,
                                 .kc = 512,
                                 .nc = 2048,
                                 .mc_once = 512,
                                 .kc_once = 512,
                                 .nc_small = 128,
                                 .kc_once_tb = 2048,
                                 .nc_small_tb = 32,
                                 .rows_outer = true};
constexpr int kMacsPerPackedElement = 16;

// f32 op(B) = Bᵀ with 32–256 rows whose vectors of 8 waste at most 8 % of the lanes (and k ≥ 3 rows, as
// direct_bt_applies says): gemm_bt_direct, B's rows read in place (Zen 4, two threads, process CPU time,
// against oneDNN in the same run, packed → direct: 64 × 2048 × 2048 NT 0.96–0.99 → 1.17–1.21×, 128 rows
// 0.88–0.92 → 1.00–1.10×, 256 rows 1.05 → 1.12×; 512 rows 1.04–1.07 → 0.99×, so they stay packed). The blocks
// as at VDPBF16PS.
constexpr int64_t kDirectMaxRows = 256;

}  // namespace

void gemm_f32(const GemmArgs<float, float>& args) {
  if (direct_bt_applies<DirectF32>(args, kDirectMaxRows)) return gemm_bt_direct<DirectF32>(args);
  gemm_blocked<Kernel>(args, kBlocking, kMacsPerPackedElement);
}

void gemm_bf16(const GemmArgs<bf16, float>& args) {
  gemm_blocked<Kernel>(args, kBlocking, kMacsPerPackedElement);
}

}  // namespace xmoe::kernels::avx2
