// AVX-512 f32 GEMM: an 8 × 48 register tile (24 zmm accumulators) fed by broadcasts of packed op(A) and three
// vector loads of packed op(B) per k. bf16 inputs are widened to f32 while packing and use the same kernel.
#include <immintrin.h>

#include <cstring>
#include <type_traits>

#include "kernels/cpu/gemm_blocking.hpp"
#include "kernels/cpu/gemm_direct_bt.hpp"
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

// gemm_bt_direct's tiles: 6 rows of B broadcast in place, NV vectors of packed op(A)ᵀ; each FMA multiplies
// op(A)'s value by B's, as the packed kernel does. A bf16 row is read a pair at a time, each value shifted
// into an f32's high half. 6 rows, not the packed kernel's 8: 8 × 48 tiles ran 256 × 2048 × 2048 NT at about
// half the speed (rows of 2048 f32 lie 8 KiB apart, so a tile's current lines share one set of the 8-way L1).
struct DirectF32 {
  static constexpr int rows = 6, width = 16, max_nv = 4, kpack = 1;
  using Packed = float;

  template <int NV, class In>
  static void run(int64_t depth, const In* b, int64_t ldb, int64_t b_rows, const float* a, float* ct,
                  int64_t ldct, bool load) {
    constexpr int MR = rows;
    constexpr int64_t per_line = 64 / sizeof(In), ahead = 4 * per_line;  // k values
    const In* row[MR];
    tile_rows(b, ldb, b_rows, row);
    __m512 acc[MR][NV];
    load_tile<16>(acc, ct, ldct, load);
    // B[i][s] broadcast: an f32 as it is; a bf16 from the 32-bit pair that holds it, at an even s the low
    // half (shifted up) and at an odd one the high half (masked).
    auto value = [&](int i, int64_t s, auto odd) __attribute__((always_inline)) {
      if constexpr (std::is_same_v<In, bf16>) {
        int32_t pair;
        std::memcpy(&pair, row[i] + s - odd(), sizeof(pair));
        const __m512i v = _mm512_set1_epi32(pair);
        // The masked shift: GCC 12 warns that the unmasked one's undefined pass-through may be uninitialized.
        if constexpr (odd())
          return _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(int32_t(0xffff0000u))));
        else
          return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xffff, v, 16));
      } else {
        return _mm512_set1_ps(row[i][s]);
      }
    };
    auto slot = [&](int64_t s, auto value_at) __attribute__((always_inline)) {
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v)
        _mm_prefetch(reinterpret_cast<const char*>(a + (s + kPrefetch) * 16 * NV + 16 * v), _MM_HINT_T0);
      __m512 av[NV];
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) av[v] = _mm512_load_ps(a + s * 16 * NV + 16 * v);
#pragma GCC unroll 32
      for (int i = 0; i < MR; ++i) {
        const __m512 bv = value_at(i);
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_fmadd_ps(av[v], bv, acc[i][v]);
      }
    };
    int64_t s = 0;
    // Two slots a step: a bf16 pair's even and odd value.
    for (; s + 1 < depth; s += 2) {
      // B's rows come from memory on the tile's first pass: a line of each, well ahead.
      if ((s & (per_line - 1)) == 0) {
#pragma GCC unroll 32
        for (int i = 0; i < MR; ++i)
          _mm_prefetch(reinterpret_cast<const char*>(row[i] + s + ahead), _MM_HINT_T0);
      }
      slot(s, [&](int i) { return value(i, s, std::false_type{}); });
      slot(s + 1, [&](int i) { return value(i, s + 1, std::true_type{}); });
    }
    // An odd depth's last value alone (for bf16 the value past it may lie past the end of B).
    if (s < depth) {
      slot(s, [&](int i) {
        if constexpr (std::is_same_v<In, bf16>)
          return _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int32_t>(uint32_t{row[i][s].bits} << 16)));
        else
          return _mm512_set1_ps(row[i][s]);
      });
    }
    store_tile<16>(acc, ct, ldct);
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
// The same with op(B) blocks of 1 MiB (256 × 1024 f32), half of a 2 MiB L2, for CPUs whose L3 cannot feed
// the tall path's 4 MiB blocks (kernel_table.cpp picks it). On Sapphire Rapids (2 MiB L2, a mesh L3;
// one thread, its CPU time, interleaved) 4096 × 2048 × 2048 NN / NT and 2048 × 2048 × 4096 TN ran 110–129
// GFLOP/s against 74–84 (52–59 % of the register-only FMA peak against 34–37 %); 512 × 512, 768 × 384 and
// 1024 × 384 blocks, and the other tile order with kc 128–256, ran level or behind. (The VDPBF16PS GEMM's
// blocks, in the same test, ran best as they are.)
constexpr GemmBlocking kL2Blocking = [] {
  GemmBlocking b = kBlocking;
  b.kc = 256;
  b.nc = 1024;
  return b;
}();
constexpr int kMacsPerPackedElement = 16;

// op(B) = Bᵀ with 32–256 rows whose vectors of 16 waste at most 8 % of the lanes (and k ≥ 3 rows, as
// direct_bt_applies says): gemm_bt_direct, B's rows read in place (Zen 4 capped at AVX-512, two threads,
// process CPU time, against oneDNN in the same run, packed → direct: f32 64 × 2048 × 2048 NT 0.92–0.93
// → 1.16×, 128 rows 0.91–0.97 → 1.04×, 256 rows level (0.96–0.97 → 0.97–0.98×), 512 rows level or behind
// (0.98–1.00 → 0.97–0.98×), so they stay packed; bf16 operands at 64 rows 163–190 → 209–211 GFLOP/s, level
// from 128). The blocks as at VDPBF16PS.
constexpr int64_t kDirectMaxRows = 256;

template <class In>
void gemm(const GemmArgs<In, float>& args, const GemmBlocking& blocking) {
  if (direct_bt_applies<DirectF32>(args, kDirectMaxRows)) return gemm_bt_direct<DirectF32>(args);
  gemm_blocked<Kernel>(args, blocking, kMacsPerPackedElement);
}

}  // namespace

void gemm_f32(const GemmArgs<float, float>& args) {
  gemm(args, kBlocking);
}
void gemm_bf16(const GemmArgs<bf16, float>& args) {
  gemm(args, kBlocking);
}
void gemm_f32_l2_blocks(const GemmArgs<float, float>& args) {
  gemm(args, kL2Blocking);
}
void gemm_bf16_l2_blocks(const GemmArgs<bf16, float>& args) {
  gemm(args, kL2Blocking);
}

}  // namespace xmoe::kernels::avx512
