// The AMX level's `medium` BF16 linear (kernels/cpu/linear_bf16tile.hpp):
//  * TDPBF16PS itself, on random and hand-made tiles, gives linear_bf16tile.hpp's step (so the reference's
//    model of the instruction is checked against the instruction);
//  * the AMX kernel gives the scalar reference's bits for m = 1..17, 33, 100, 130 and awkward k / n /
//    column ranges, on data with denormals, signed zeros and rounding ties;
//  * the reference lies within f32 accumulation error of PyTorch's float64 product of the bf16-rounded
//    operands (the fixture of tools/make_bf16dot_fixture.py);
//  * a row's outputs do not depend on the rest of the batch or the thread count;
//  * the AMX table is medium's at the AMX level only, with every other entry the AVX512-BF16 level's.
// Without AMX (or the OS's tile permission) the kernel tests skip; the reference tests always run.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "bf16_linear_cases.hpp"
#include "kernels/cpu/linear_bf16tile.hpp"
#include "kernels/cpu/linear_quant_bf16tile.hpp"
#include "kernels/cpu/variants.hpp"
#include "kernels/cpu_features.hpp"
#include "kernels/kernels.hpp"
#include "kernels/linear.hpp"
#include "xmoe/error.hpp"
#include "xmoe/safetensors.hpp"

namespace xmoe::kernels {
namespace {

using namespace test;

const KernelTable* amx_medium_table() {
  const CpuFeatures features = detect_cpu_features();
  if (!isa_supported(features, Isa::amx)) return nullptr;
  return &kernel_table(Isa::amx, features, MatmulPrecision::medium);
}

TEST(LinearBf16Tile, KernelMatchesReferenceBitForBit) {
  const KernelTable* amx = amx_medium_table();
  if (!amx) GTEST_SKIP() << "no AMX-BF16 (or no tile permission) on this CPU";
  const LinearFn fast = amx->linear[size_t(WeightFormat::bf16)];
  std::mt19937 rng(11);
  int64_t cases = 0;
  for (int64_t m : {1, 2, 3, 5, 8, 9, 15, 16, 17, 33, 100, 130})
    for (int64_t k : {1, 31, 32, 33, 64, 67, 130})
      for (int64_t n : {1, 7, 16, 17, 40, 49, 70}) {
        if (m > 33 && k != 67 && k != 64) continue;  // the large m cross the x block; two k are enough there
        const int64_t n0 = n > 16 ? 3 : 0;           // a column range not starting at a tile
        ASSERT_NO_FATAL_FAILURE(
            expect_same_bits_on_random_case(fast, reference::linear_bf16_medium_tile, m, k, n, n0, rng));
        ++cases;
      }
  EXPECT_GT(cases, 300);
}

// Hand-made steps whose result depends on each documented detail of TDPBF16PS; the instruction (through the
// kernel) and the reference must give the stated values. k = 64: step 0 holds pairs 0..15, step 1 the rest.
TEST(LinearBf16Tile, InstructionSemanticsAreTheReferences) {
  struct Case {
    const char* what;
    std::vector<std::pair<int, float>> x, w;  // (k index, value); the rest are zero
    float expected;
  };
  const float big = 0x1p24f;
  const std::vector<Case> cases = {
      // Even and odd products in separate sums: the even sum is 2^24, + 1 (rounds back to 2^24 by
      // round-to-even), − 2^24 = 0, and the odd one 1 + 1 = 2: 2. One chain in k order loses all three ones
      // against 2^24 and gives 0.
      {"two sums per step",
       {{0, big}, {1, 1}, {2, 1}, {3, 1}, {4, -big}},
       {{0, 1}, {1, 1}, {2, 1}, {3, 1}, {4, 1}},
       2.0f},
      // The step's even + odd meets the running sum as one value: step 0 leaves 1; step 1's even 2^-24 and
      // odd 2^-25 make 1.5·2^-24, and 1 + 1.5·2^-24 rounds to 1 + 2^-23 (added one by one: 1, then 1).
      {"step sum rounded once",
       {{0, 1}, {32, 0x1p-24f}, {33, 0x1p-25f}},
       {{0, 1}, {32, 1}, {33, 1}},
       1.0f + 0x1p-23f},
      // A bf16 denormal operand counts as zero.
      {"denormal operand is zero", {{0, 0x1p-130f}}, {{0, 0x1p100f}}, 0.0f},
      // 1.5·2^-126 − 2^-126 = 2^-127 in the even sum is denormal: flushed.
      {"denormal sum is flushed", {{0, 1.5f * 0x1p-126f}, {2, -0x1p-126f}}, {{0, 1}, {2, 1}}, 0.0f},
      // Products are exact: (1 + 2^-7)² = 1 + 2^-6 + 2^-14.
      {"exact product", {{0, 1 + 0x1p-7f}}, {{0, 1 + 0x1p-7f}}, 1 + 0x1p-6f + 0x1p-14f},
  };
  const KernelTable* amx = amx_medium_table();
  for (const Case& c : cases) {
    std::vector<float> x(64, 0.0f);
    std::vector<uint16_t> v(64, 0);
    for (auto [p, value] : c.x) x[p] = value;
    for (auto [p, value] : c.w) v[p] = bf16::from_float(value);
    const Bf16Weight tw(v, 1, 64, 64);
    EXPECT_EQ(run(reference::linear_bf16_medium_tile, tw.w, x, 1, 64, 0, 1)[0], c.expected)
        << c.what << " (reference)";
    if (amx) {
      EXPECT_EQ(run(amx->linear[size_t(WeightFormat::bf16)], tw.w, x, 1, 64, 0, 1)[0], c.expected)
          << c.what << " (AMX)";
    }
  }
}

// PyTorch's float64 product of the bf16-rounded operands; each output's path has (steps + 5) roundings of a
// partial sum bounded by Σ|x̂ ŵ| (a step's longest sum is 16 additions, then the step total, then the running
// sum): bound (16 + 1 + steps) · 2^-24 · Σ|x̂ ŵ|.
TEST(LinearBf16Tile, ReferenceIsWithinF32ErrorOfPyTorch) {
  std::vector<std::pair<std::string, LinearFn>> kernels{{"reference", reference::linear_bf16_medium_tile}};
  if (const KernelTable* amx = amx_medium_table())
    kernels.push_back({"amx", amx->linear[size_t(WeightFormat::bf16)]});
  expect_within_f32_bound_of_pytorch(kernels, 1, 17);
}

TEST(LinearBf16Tile, RowsDoNotDependOnTheBatchOrThreads) {
  const KernelTable* amx = amx_medium_table();
  if (!amx) GTEST_SKIP() << "no AMX-BF16 (or no tile permission) on this CPU";
  expect_rows_independent_of_batch_and_threads(*amx);
}

// The AMX GEMM (kernels/cpu/gemm_amx.cpp) takes the same arithmetic per C element: with C overwritten, each
// element is bf16tile_row of op(A)'s row and op(B)'s column, for every transpose of op(A) and op(B) (op(A) =
// Aᵀ: the layer's weight gradients over token rows) and shapes with m, n and k tails and several k blocks (k =
// 1100 crosses two).
TEST(LinearBf16Tile, GemmMatchesTheArithmeticBitForBit) {
  if (!isa_supported(detect_cpu_features(), Isa::amx)) GTEST_SKIP() << "no AMX-BF16 (or no tile permission)";
  std::mt19937 rng(3);
  struct Shape {
    int64_t m, n, k;
  };
  for (const Shape sh : {Shape{1, 1, 1}, Shape{17, 33, 65}, Shape{40, 70, 1100}, Shape{70, 20, 31}}) {
    for (int trans = 0; trans < 4; ++trans) {
      const bool ta = trans & 1, tb = trans & 2;
      std::vector<uint16_t> a(static_cast<size_t>(sh.m * sh.k)), b(static_cast<size_t>(sh.k * sh.n));
      for (uint16_t& e : a) e = bf16::from_float(tricky_x(rng));
      for (uint16_t& e : b) e = tricky_w(rng);
      std::vector<float> c(static_cast<size_t>(sh.m * sh.n), std::nanf(""));
      GemmArgs<bf16, float> g;
      g.m = sh.m, g.n = sh.n, g.k = sh.k;
      g.a = reinterpret_cast<const bf16*>(a.data()), g.lda = ta ? sh.m : sh.k, g.trans_a = ta;
      g.b = reinterpret_cast<const bf16*>(b.data()), g.ldb = tb ? sh.k : sh.n, g.trans_b = tb;
      g.c = c.data(), g.ldc = sh.n;
      amx::gemm_bf16(g);
      const int64_t steps = (sh.k + 31) / 32;
      std::vector<uint16_t> row(static_cast<size_t>(steps * 32)), col(row.size());
      for (int64_t i = 0; i < sh.m; ++i)
        for (int64_t j = 0; j < sh.n; ++j) {
          for (int64_t p = 0; p < sh.k; ++p) {
            row[p] = ta ? a[p * sh.m + i] : a[i * sh.k + p];
            col[p] = tb ? b[j * sh.k + p] : b[p * sh.n + j];
          }
          const float want = reference::bf16tile_row(row.data(), col.data(), steps);
          ASSERT_TRUE(same_bits(c[i * sh.n + j], want))
              << "m=" << sh.m << " n=" << sh.n << " k=" << sh.k << " trans=" << trans << " C[" << i << ","
              << j << "]";
        }
    }
  }
}

TEST(LinearBf16Tile, AmxTablesHoldTheTileKernelsOnly) {
  const CpuFeatures features = detect_cpu_features();
  if (!isa_supported(features, Isa::amx)) GTEST_SKIP() << "no AMX-BF16 (or no tile permission) on this CPU";
  const KernelTable& amx = kernel_table(Isa::amx, features, MatmulPrecision::medium);
  const KernelTable& vdp = kernel_table(Isa::avx512_bf16, features, MatmulPrecision::medium);
  EXPECT_EQ(amx.isa, Isa::amx);
  EXPECT_EQ(amx.precision, MatmulPrecision::medium);
  EXPECT_EQ(amx.linear[size_t(WeightFormat::bf16)], amx::linear_bf16_medium);
  EXPECT_EQ(amx.linear[size_t(WeightFormat::fp8_block)], amx::linear_fp8_block_medium);
  EXPECT_EQ(amx.linear[size_t(WeightFormat::mxfp4)], amx::linear_mxfp4_medium);
  for (const WeightFormat f : {WeightFormat::f32, WeightFormat::f16, WeightFormat::nvfp4}) {
    EXPECT_EQ(amx.linear[size_t(f)], vdp.linear[size_t(f)]) << weight_format_name(f);
  }
  EXPECT_EQ(amx.gemm_bf16, amx::gemm_bf16);
  EXPECT_EQ(amx.gemm_f32, vdp.gemm_f32);
  // Highest precision: the AVX512-BF16 level's linears (f32 arithmetic), AMX's bf16 GEMM.
  const KernelTable& highest = kernel_table(Isa::amx, features, MatmulPrecision::highest);
  const KernelTable& below = kernel_table(Isa::avx512_bf16, features);
  EXPECT_EQ(highest.isa, Isa::amx);
  EXPECT_EQ(highest.precision, MatmulPrecision::highest);
  for (int f = 0; f < kWeightFormatCount; ++f) EXPECT_EQ(highest.linear[f], below.linear[f]) << f;
  EXPECT_EQ(highest.gemm_bf16, amx::gemm_bf16);
  EXPECT_EQ(highest.gemm_f32, below.gemm_f32);
  EXPECT_EQ(highest.attention_tile, below.attention_tile);
}

}  // namespace
}  // namespace xmoe::kernels
