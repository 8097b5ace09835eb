// The kernel table's linear kernels for unscaled formats (f32, bf16, f16 weights): every variant this CPU
// runs gives the reference's bits (one shared summation order), for tile edges in m, n and k and for row
// strides wider than a row (views into fused tensors); the reference is a dot product; linear_forward's
// column split (equal shares, or decode's chunks handed out to free threads) does not change a row's result;
// join_rows joins only adjacent views.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <initializer_list>
#include <random>
#include <vector>

#include "kernels/cpu_features.hpp"
#include "kernels/kernels.hpp"
#include "kernels/linear.hpp"
#include "kernels/register_fma_peak.hpp"
#include "xmoe/error.hpp"

namespace xmoe::kernels {
namespace {

// IEEE binary16 of a float, rounding to nearest even: zero or the normal range only, where test data stays
// (f16_value below).
uint16_t to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) == 0) return static_cast<uint16_t>(u >> 16);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const int32_t exp = static_cast<int32_t>((u >> 23) & 0xffu) - 127 + 15;
  uint32_t mant = u & 0x7fffffu;
  uint32_t h = sign | (static_cast<uint32_t>(exp) << 10) | (mant >> 13);
  const uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(h);
}

// Test values as f16 holds them: zero or at least 2^-10 in magnitude (f16's normal range starts at 2^-14).
float f16_value(float f) {
  return std::abs(f) < 0x1p-10f ? 0.0f : f;
}

// A [n, k] weight in `format` with rows `stride` elements apart, from f32 values.
struct TestWeight {
  std::vector<std::byte> bytes;
  PackedWeight w;
  TestWeight(WeightFormat format, const std::vector<float>& v, int64_t n, int64_t k, int64_t stride) {
    const int64_t es = format == WeightFormat::f32 ? 4 : 2;
    bytes.assign(static_cast<size_t>(n * stride * es), std::byte{0x7f});  // gap bytes: NaN-like garbage
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < k; ++c) {
        const float f = v[static_cast<size_t>(r * k + c)];
        std::byte* p = bytes.data() + (r * stride + c) * es;
        if (format == WeightFormat::f32) {
          std::memcpy(p, &f, 4);
        } else {
          const uint16_t h = format == WeightFormat::bf16 ? bf16::from_float(f) : to_f16(f16_value(f));
          std::memcpy(p, &h, 2);
        }
      }
    w.format = format;
    w.rows = n;
    w.cols = k;
    w.data = bytes.data();
    w.row_bytes = stride * es;
  }
};

TEST(LinearKernels, VariantsMatchReferenceBitForBit) {
  const CpuFeatures features = detect_cpu_features();
  const KernelTable& ref = reference_kernel_table();
  int variants = 0;
  for (Isa isa : {Isa::avx2, Isa::avx512, Isa::avx512_bf16}) {
    if (!isa_supported(features, isa)) continue;
    const KernelTable& fast = kernel_table(isa, features);
    ++variants;
    std::mt19937 rng(7);
    std::normal_distribution<float> nd;
    for (WeightFormat format : {WeightFormat::f32, WeightFormat::bf16, WeightFormat::f16})
      for (int64_t m : {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 16, 17, 100})
        for (int64_t n : {1, 7, 8, 13, 33})
          for (int64_t k : {1, 15, 16, 17, 48, 64, 100, 1000})
            for (int64_t pad : {0, 5}) {
              std::vector<float> x(static_cast<size_t>(m * k)), v(static_cast<size_t>(n * k));
              for (float& e : x) e = nd(rng);
              for (float& e : v) e = nd(rng);
              const TestWeight tw(format, v, n, k, k + pad);
              std::vector<float> a(static_cast<size_t>(m * n)), b(a.size());
              fast.linear[size_t(format)]({x.data(), m, k, &tw.w, 0, n, a.data(), n});
              ref.linear[size_t(format)]({x.data(), m, k, &tw.w, 0, n, b.data(), n});
              EXPECT_EQ(a, b) << isa_name(isa) << " " << weight_format_name(format) << " m=" << m
                              << " n=" << n << " k=" << k << " pad=" << pad;
              // A column range gives the same values as the whole row.
              if (n > 3) {
                std::vector<float> part(a.size(), 0.0f);
                fast.linear[size_t(format)]({x.data(), m, k, &tw.w, 2, n - 1, part.data(), n});
                for (int64_t i = 0; i < m; ++i)
                  for (int64_t j = 2; j < n - 1; ++j) EXPECT_EQ(part[i * n + j], a[i * n + j]);
              }
            }
  }
  if (variants == 0) GTEST_SKIP() << "no vector variant on this CPU";
}

// BF16 weights of n rows (row stride k + pad) against m x rows, for each m and k, on every vector level the
// CPU has: the reference's bits. Draws x then the weights from rng for each (level, m, k) in turn.
void expect_bf16_levels_match_reference(uint32_t seed, std::initializer_list<int64_t> ms,
                                        std::initializer_list<int64_t> ks, int64_t n, int64_t pad) {
  const CpuFeatures features = detect_cpu_features();
  const KernelTable& ref = reference_kernel_table();
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  int variants = 0;
  for (Isa isa : {Isa::avx2, Isa::avx512, Isa::avx512_bf16}) {
    if (!isa_supported(features, isa)) continue;
    const KernelTable& fast = kernel_table(isa, features);
    ++variants;
    for (int64_t m : ms)
      for (int64_t k : ks) {
        std::vector<float> x(static_cast<size_t>(m * k)), v(static_cast<size_t>(n * k));
        for (float& e : x) e = nd(rng);
        for (float& e : v) e = nd(rng);
        const TestWeight tw(WeightFormat::bf16, v, n, k, k + pad);
        std::vector<float> a(static_cast<size_t>(m * n)), b(a.size());
        fast.linear[size_t(WeightFormat::bf16)]({x.data(), m, k, &tw.w, 0, n, a.data(), n});
        ref.linear[size_t(WeightFormat::bf16)]({x.data(), m, k, &tw.w, 0, n, b.data(), n});
        EXPECT_EQ(a, b) << isa_name(isa) << " m=" << m << " k=" << k;
      }
  }
  if (variants == 0) GTEST_SKIP() << "no vector variant on this CPU";
}

TEST(LinearKernels, ManyRowsOnBothSidesOfTheFewRowsKernelsLimit) {
  // BF16 products of a few dozen rows run the pair-widened kernels while their x rows fit in 512 KiB
  // (AVX-512) or 1 MiB (AVX2), the panel GEMMs beyond: 100 rows of k = 1000 (400 KB) take the first, 300
  // rows (1.2 MB) the second; both give the reference's bits.
  expect_bf16_levels_match_reference(11, {100, 300}, {1000, 1009}, 21, 3);
}

TEST(LinearKernels, LongRowsInBlocksOfStepsKeepTheBits) {
  // At AVX2 a few-row tile whose x rows of one parity outgrow L1 (k = 4096 at 4 rows and more) runs its
  // passes over blocks of steps (2 at 4 rows, 3 at 5), each pair's chain resumed from its stored
  // accumulators; k = 4100 puts the zero-padded tail step in the last block, and 37 weight rows end on a set
  // of 5 (a single-row pair).
  expect_bf16_levels_match_reference(5, {4, 8, 13}, {4096, 4100}, 37, 8);
}

TEST(LinearKernels, ReferenceIsADotProduct) {
  const std::vector<float> x{1, 2, 3, 4, -1, 0.5f}, v{1, 1, 1, 1, 2, 2, 0.5f, -1, 0, 0, 4, 2};
  for (WeightFormat format : {WeightFormat::f32, WeightFormat::bf16, WeightFormat::f16}) {
    const TestWeight tw(format, v, 2, 6, 6);  // every value is exact in bf16 and f16
    std::vector<float> y(2);
    reference_kernel_table().linear[size_t(format)]({x.data(), 1, 6, &tw.w, 0, 2, y.data(), 2});
    EXPECT_EQ(y[0], 1 + 2 + 3 + 4 - 2 + 1) << weight_format_name(format);
    EXPECT_EQ(y[1], 0.5f - 2 + 0 + 0 - 4 + 1) << weight_format_name(format);
  }
}

TEST(LinearKernels, RowsDoNotDependOnTheBatchOrThreads) {
  // 200 rows take the many-rows path in several chunks, 16 rows the batched-decode path; each row alone takes
  // the one-row decode path.
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  const int64_t k = 300, n = 517, m = 200;
  std::vector<float> v(static_cast<size_t>(n * k)), x(static_cast<size_t>(m * k));
  for (float& e : v) e = nd(rng);
  for (float& e : x) e = nd(rng);
  for (const WeightFormat format : {WeightFormat::f32, WeightFormat::bf16}) {
    const TestWeight tw(format, v, n, k, k);
    const KernelTable& table = best_kernel_table(detect_cpu_features());
    std::vector<float> all(static_cast<size_t>(m * n)), one(static_cast<size_t>(n)), few(16 * one.size());
    const int saved = omp_get_max_threads();
    omp_set_num_threads(2);
    linear_forward(table, tw.w, x.data(), m, all.data());
    linear_forward(table, tw.w, x.data() + 5 * k, 16, few.data());
    omp_set_num_threads(1);
    for (int64_t i = 0; i < m; ++i) {
      linear_forward(table, tw.w, x.data() + i * k, 1, one.data());
      EXPECT_TRUE(std::equal(one.begin(), one.end(), all.begin() + i * n))
          << weight_format_name(format) << " row " << i;
      if (i >= 5 && i < 5 + 16) {
        EXPECT_TRUE(std::equal(one.begin(), one.end(), few.begin() + (i - 5) * n))
            << weight_format_name(format) << " row " << i << " in a batch of 16";
      }
    }
    omp_set_num_threads(saved);
  }
}

TEST(LinearKernels, DecodeChunksHandedToThreadsKeepTheBits) {
  // 8.5 MB of f32 weights: one row's product is cut into 16 chunks, 3 rows' into 10 (column_split.hpp), each
  // handed to whichever thread is free; every column must still be the one-thread call's.
  std::mt19937 rng(11);
  std::normal_distribution<float> nd;
  const int64_t k = 520, n = 4099;
  std::vector<float> v(static_cast<size_t>(n * k)), x(static_cast<size_t>(3 * k));
  for (float& e : v) e = nd(rng);
  for (float& e : x) e = nd(rng);
  const TestWeight tw(WeightFormat::f32, v, n, k, k);
  const KernelTable& table = best_kernel_table(detect_cpu_features());
  const int saved = omp_get_max_threads();
  for (const int64_t m : {1, 3}) {
    std::vector<float> alone(static_cast<size_t>(m * n)), shared(alone.size());
    omp_set_num_threads(1);
    linear_forward(table, tw.w, x.data(), m, alone.data());
    for (const int threads : {2, 3}) {
      omp_set_num_threads(threads);
      std::fill(shared.begin(), shared.end(), -1.0f);
      linear_forward(table, tw.w, x.data(), m, shared.data());
      EXPECT_EQ(shared, alone) << "m=" << m << " threads=" << threads;
    }
  }
  omp_set_num_threads(saved);
}

TEST(LinearKernels, JoinRowsJoinsOnlyAdjacentViews) {
  std::vector<float> v(static_cast<size_t>(10 * 4), 1.0f);
  const TestWeight tw(WeightFormat::f32, v, 10, 4, 4);
  PackedWeight a = tw.w, b = tw.w, c = tw.w;
  a.rows = 3;
  b.rows = 5;
  b.data = a.data + 3 * a.row_bytes;
  c.rows = 2;
  c.data = b.data + 5 * b.row_bytes;
  const PackedWeight abc[] = {a, b, c};
  const auto joined = join_rows(abc);
  ASSERT_TRUE(joined.has_value());
  EXPECT_EQ(joined->rows, 10);
  EXPECT_EQ(joined->data, a.data);
  const PackedWeight gap[] = {a, c};  // b's rows lie between them
  EXPECT_FALSE(join_rows(gap).has_value());
  PackedWeight other = b;
  other.format = WeightFormat::bf16;
  const PackedWeight mixed[] = {a, other};
  EXPECT_FALSE(join_rows(mixed).has_value());
}

TEST(LinearKernels, MissingKernelIsNamed) {
  std::vector<float> v(8, 1.0f), x(4, 1.0f), y(2);
  TestWeight tw(WeightFormat::f32, v, 2, 4, 4);
  KernelTable table = reference_kernel_table();
  table.linear[size_t(WeightFormat::f32)] = nullptr;
  try {
    linear_forward(table, tw.w, x.data(), 1, y.data());
    FAIL() << "no error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("f32"), std::string::npos) << e.what();
  }
}

// The FMA peak the benchmarks divide by runs at every level the CPU has (how fast is the benchmarks'
// business, not a test's: timings under sanitizers and load say nothing); bad thread counts and unsupported
// levels are errors.
TEST(RegisterFmaPeak, EveryLevelRunsAndBadArgumentsThrow) {
  const CpuFeatures features = detect_cpu_features();
  for (Isa isa : {Isa::reference, Isa::avx2, Isa::avx512}) {
    if (!isa_supported(features, isa)) continue;
    EXPECT_GT(register_fma_peak_gflops(isa, features, 1, 0.01), 0.0) << isa_name(isa);
  }
  if (features.has_avx512_bf16()) {
    EXPECT_GT(register_bf16_dot_peak_gflops(features, 1, 0.01), 0.0);
  }
  if (features.has_amx_bf16()) {
    EXPECT_GT(register_amx_bf16_peak_gflops(features, 2, 0.01), 0.0);
    EXPECT_THROW(register_amx_bf16_peak_gflops(features, 0), Error);
  }
  EXPECT_THROW(register_fma_peak_gflops(Isa::reference, features, 0), Error);
  CpuFeatures none;
  EXPECT_THROW(register_fma_peak_gflops(Isa::avx2, none, 1), Error);
  EXPECT_THROW(register_bf16_dot_peak_gflops(none, 1), Error);
  EXPECT_THROW(register_amx_bf16_peak_gflops(none, 1), Error);
}

}  // namespace
}  // namespace xmoe::kernels
