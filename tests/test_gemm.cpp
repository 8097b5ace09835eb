// GEMM variants against the reference oracle, plus the determinism contract of kernels.hpp: bit-identical
// results for any thread count and under appended zero k-steps.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/variants.hpp"
#include "kernels/gemm_probe.hpp"
#include "kernels/register_fma_peak.hpp"
#include "xmoe/error.hpp"

namespace xmoe::kernels {
namespace {

struct Variant {
  const char* name;
  Isa isa;
  void (*f32)(const GemmArgs<float, float>&);  // null: the level has no f32 GEMM of its own
  void (*bf16)(const GemmArgs<bf16, float>&);
  bool fma_chain;  // f32 products accumulate as one std::fma chain in k order (exactly reproducible)
};

// GoogleTest prints a parameter in test listings; without this it dumps the struct's raw bytes.
[[maybe_unused]] void PrintTo(const Variant& v, std::ostream* os) {
  *os << v.name;
}

const Variant kVariants[] = {
    {"reference", Isa::reference, reference::gemm_f32, reference::gemm_bf16, false},
    {"avx2", Isa::avx2, avx2::gemm_f32, avx2::gemm_bf16, true},
    {"avx512", Isa::avx512, avx512::gemm_f32, avx512::gemm_bf16, true},
    {"avx512_l2_blocks", Isa::avx512, avx512::gemm_f32_l2_blocks, avx512::gemm_bf16_l2_blocks, true},
    {"avx512_bf16", Isa::avx512_bf16, nullptr, avx512_bf16::gemm_bf16, false},
    {"amx", Isa::amx, nullptr, amx::gemm_bf16, false},
};

// Restores the OpenMP thread count a test changed.
class ThreadCountGuard {
 public:
  ThreadCountGuard() : saved_(omp_get_max_threads()) {}
  ~ThreadCountGuard() { omp_set_num_threads(saved_); }
  ThreadCountGuard(const ThreadCountGuard&) = delete;
  ThreadCountGuard& operator=(const ThreadCountGuard&) = delete;

 private:
  int saved_;
};

// One GEMM problem with its operands stored as the flags say, rows padded past the leading dimension's need.
template <class In>
struct Problem {
  int64_t m, n, k;
  bool ta, tb, accumulate;
  int64_t lda, ldb, ldc;
  std::vector<In> a, b;
  std::vector<float> c0;  // C before the call

  Problem(int64_t m_, int64_t n_, int64_t k_, bool ta_, bool tb_, bool acc, int64_t pad, uint32_t seed)
      : m(m_), n(n_), k(k_), ta(ta_), tb(tb_), accumulate(acc) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    lda = (ta ? m : k) + pad;
    ldb = (tb ? k : n) + pad;
    ldc = n + pad;
    a.resize(static_cast<size_t>(std::max<int64_t>(1, (ta ? k : m) * lda)));
    b.resize(static_cast<size_t>(std::max<int64_t>(1, (tb ? n : k) * ldb)));
    c0.resize(static_cast<size_t>(std::max<int64_t>(1, m * ldc)));
    for (auto& x : a) x = In(dist(rng));
    for (auto& x : b) x = In(dist(rng));
    for (auto& x : c0) x = acc ? dist(rng) : std::numeric_limits<float>::quiet_NaN();
  }

  float a_at(int64_t i, int64_t p) const { return static_cast<float>(ta ? a[p * lda + i] : a[i * lda + p]); }
  float b_at(int64_t p, int64_t j) const { return static_cast<float>(tb ? b[j * ldb + p] : b[p * ldb + j]); }

  std::vector<float> run(void (*gemm)(const GemmArgs<In, float>&)) const {
    std::vector<float> c = c0;
    GemmArgs<In, float> g;
    g.m = m, g.n = n, g.k = k;
    g.a = a.data(), g.lda = lda, g.trans_a = ta;
    g.b = b.data(), g.ldb = ldb, g.trans_b = tb;
    g.c = c.data(), g.ldc = ldc, g.accumulate = accumulate;
    gemm(g);
    return c;
  }

  std::string str() const {
    return "m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k) +
           " ta=" + std::to_string(ta) + " tb=" + std::to_string(tb) + " acc=" + std::to_string(accumulate) +
           " lda=" + std::to_string(lda) + " ldb=" + std::to_string(ldb) + " ldc=" + std::to_string(ldc);
  }

  // Compares with the reference's output: within 2e-6·√k of Σ|a·b| + |c0| per element (both sides round k
  // times), and the padding past each row of C untouched.
  void expect_close(const std::vector<float>& got, const std::vector<float>& want) const {
    int failures = 0;
    for (int64_t i = 0; i < m && failures < 5; ++i) {
      for (int64_t j = 0; j < ldc && failures < 5; ++j) {
        const size_t at = static_cast<size_t>(i * ldc + j);
        if (j >= n) {
          if (std::memcmp(&got[at], &c0[at], sizeof(float)) != 0) {
            ADD_FAILURE() << str() << ": wrote past row end at " << i << "," << j;
            ++failures;
          }
          continue;
        }
        double scale = accumulate ? std::fabs(c0[at]) : 0.0;
        for (int64_t p = 0; p < k; ++p) scale += std::fabs(static_cast<double>(a_at(i, p)) * b_at(p, j));
        const double tol = 2e-6 * std::sqrt(static_cast<double>(k) + 1.0) * scale;
        if (!(std::fabs(static_cast<double>(got[at]) - want[at]) <= tol)) {
          ADD_FAILURE() << str() << ": C[" << i << "," << j << "] = " << got[at] << ", reference " << want[at]
                        << ", tolerance " << tol;
          ++failures;
        }
      }
    }
  }

  // The contract's f32 evaluation: one fused multiply-add chain per element in ascending k.
  std::vector<float> fma_chain() const {
    std::vector<float> c = c0;
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        float acc = accumulate ? c0[static_cast<size_t>(i * ldc + j)] : 0.0f;
        for (int64_t p = 0; p < k; ++p) acc = std::fma(a_at(i, p), b_at(p, j), acc);
        c[static_cast<size_t>(i * ldc + j)] = acc;
      }
    }
    return c;
  }
};

struct Shape3 {
  int64_t m, n, k;
};

// Single elements, primes, sizes one off the 8 × 48 / 6 × 16 / 6 × 64 tiles and the kc = 256 / 512 blocks,
// more rows than one mc block, more columns than one nc block, and k = 0. Up to 512 rows take the few-rows
// path (one op(A) block, narrow op(B) blocks, k blocks outermost, the next block's source prefetched while
// one multiplies): 301 rows over several k blocks, and k past the 1024 / 2048 blocks of an op(B) = Bᵀ with a
// k tail, rows off every tile; 530 rows the tall one, over several (equal) mc and kc blocks. An op(B) = Bᵀ
// of 32–512 rows (AVX2, AVX-512: 256) that fill whole vectors, with k at least 3 rows, reads B in place (301,
// 64, 300, 48 rows): B's rows off its 6-row tiles, op(A)'s rows off its 64-lane panels, k-blocks with an odd
// tail, Cᵀ chunks. 520 × 1100 runs the tall path over two op(B) blocks of AVX-512's L2 blocking (1056
// columns).
const Shape3 kShapes[] = {{1, 1, 1},      {1, 1, 7},      {1, 37, 1},      {5, 1, 3},       {3, 5, 0},
                          {14, 32, 256},  {15, 33, 257},  {13, 31, 255},   {29, 97, 101},   {6, 16, 513},
                          {8, 48, 64},    {9, 49, 65},    {7, 47, 63},     {6, 64, 33},     {41, 71, 259},
                          {181, 17, 20},  {3, 2081, 5},   {2, 3, 1030},    {301, 70, 1100}, {37, 100, 2101},
                          {530, 50, 600}, {64, 71, 2101}, {300, 13, 1033}, {48, 200, 151},  {520, 1100, 40}};

bool supported(const Variant& v) {
  return isa_supported(detect_cpu_features(), v.isa);
}

class GemmVariant : public ::testing::TestWithParam<Variant> {
 protected:
  void SetUp() override {
    if (!supported(GetParam())) GTEST_SKIP() << GetParam().name << " is not supported by this CPU";
  }
};

template <class In>
void check_against_reference(void (*gemm)(const GemmArgs<In, float>&),
                             void (*ref)(const GemmArgs<In, float>&), bool exact_fma_chain) {
  uint32_t seed = 1;
  for (const Shape3& s : kShapes) {
    for (int trans = 0; trans < 4; ++trans) {
      for (int acc = 0; acc < 2; ++acc) {
        const Problem<In> p(s.m, s.n, s.k, trans & 1, trans & 2, acc, (seed % 3) * 5, seed);
        ++seed;
        const std::vector<float> got = p.run(gemm);
        p.expect_close(got, p.run(ref));
        if (exact_fma_chain) {
          const std::vector<float> want = p.fma_chain();
          for (int64_t i = 0; i < p.m; ++i)
            ASSERT_EQ(0, std::memcmp(&got[i * p.ldc], &want[i * p.ldc], sizeof(float) * p.n)) << p.str();
        }
      }
    }
  }
}

TEST_P(GemmVariant, F32MatchesReference) {
  if (GetParam().f32 == nullptr) GTEST_SKIP() << "no f32 GEMM at this level";
  if (GetParam().isa == Isa::reference) GTEST_SKIP() << "the reference is the oracle";
  check_against_reference<float>(GetParam().f32, reference::gemm_f32, GetParam().fma_chain);
}

TEST_P(GemmVariant, Bf16MatchesReference) {
  if (GetParam().isa == Isa::reference) GTEST_SKIP() << "the reference is the oracle";
  check_against_reference<bf16>(GetParam().bf16, reference::gemm_bf16, GetParam().fma_chain);
}

template <class In>
void check_thread_count_invariance(void (*gemm)(const GemmArgs<In, float>&)) {
  ThreadCountGuard guard;
  // Tall products (every thread multiplies the same op(B) block, packed once by the team): several kc
  // blocks, so each of the two shared op(B) buffers is reused, an nc edge, and edge panels split over
  // threads; then a wide one, split over columns. 150 rows take the few-rows path on one thread and other
  // grids on two and three (the tall path with op(B) shared; at AVX-512 on two threads, the few-rows path
  // split over columns), which walk the blocks in other orders with other prefetched sources. 530 rows take
  // the tall path with several mc blocks a thread.
  const Shape3 shapes[] = {{150, 90, 517}, {60, 2100, 1100}, {9, 400, 300}, {530, 150, 1100}};
  for (const Shape3& s : shapes) {
    for (int trans = 0; trans < 4; ++trans) {
      const Problem<In> p(s.m, s.n, s.k, trans & 1, trans & 2, trans == 1, 3, 77 + trans);
      omp_set_num_threads(1);
      const std::vector<float> one = p.run(gemm);
      for (int threads : {2, 3}) {
        omp_set_num_threads(threads);
        const std::vector<float> many = p.run(gemm);
        ASSERT_EQ(0, std::memcmp(one.data(), many.data(), one.size() * sizeof(float)))
            << p.str() << " threads=" << threads;
      }
    }
  }
}

TEST_P(GemmVariant, F32ThreadCountInvariant) {
  if (GetParam().f32 == nullptr) GTEST_SKIP() << "no f32 GEMM at this level";
  if (GetParam().isa == Isa::reference) GTEST_SKIP() << "the reference runs no threads";
  check_thread_count_invariance<float>(GetParam().f32);
}

TEST_P(GemmVariant, Bf16ThreadCountInvariant) {
  if (GetParam().isa == Isa::reference) GTEST_SKIP() << "the reference runs no threads";
  check_thread_count_invariance<bf16>(GetParam().bf16);
}

// Padded tokens: op(A) = Aᵀ with A stored [k, m]; appending zero rows to A (and arbitrary rows to B) must not
// change a single bit, including when the padding crosses kc blocks or completes an odd bf16 pair.
template <class In>
void check_zero_k_padding(void (*gemm)(const GemmArgs<In, float>&)) {
  for (const bool ta : {true, false}) {
    for (const bool tb : {false, true}) {
      for (const int64_t extra : {1, 7, 300}) {
        const int64_t m = 37, n = 45, k = 251;
        Problem<In> base(m, n, k, ta, tb, tb, 0, 11);
        Problem<In> padded(m, n, k + extra, ta, tb, tb, 0, 12);
        padded.c0 = base.c0;
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t p = 0; p < k + extra; ++p) {
            In& dst = ta ? padded.a[p * padded.lda + i] : padded.a[i * padded.lda + p];
            dst = p < k ? (ta ? base.a[p * base.lda + i] : base.a[i * base.lda + p]) : In(0.0f);
          }
        }
        for (int64_t p = 0; p < k; ++p) {
          for (int64_t j = 0; j < n; ++j) {
            (tb ? padded.b[j * padded.ldb + p] : padded.b[p * padded.ldb + j]) =
                tb ? base.b[j * base.ldb + p] : base.b[p * base.ldb + j];
          }
        }
        const std::vector<float> want = base.run(gemm), got = padded.run(gemm);
        ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)))
            << padded.str() << " extra=" << extra;
      }
    }
  }
}

// Batch composition: a row of C is the same bits whichever rows of op(A) share the call, though the row
// count picks the path (the tall one, the few-rows one, at VDPBF16PS B read in place for op(B) = Bᵀ, or
// the packed path for row counts that would leave vector lanes empty).
template <class In>
void check_row_subsets(void (*gemm)(const GemmArgs<In, float>&)) {
  struct Rows {
    int64_t first, count;
  };
  const Rows subsets[] = {{0, 64}, {64, 300}, {100, 32}, {200, 100}, {7, 1}, {3, 37}};
  for (int trans = 0; trans < 4; ++trans) {
    const Problem<In> p(530, 70, 1100, trans & 1, trans & 2, trans == 3, 3, 91 + trans);
    const std::vector<float> all = p.run(gemm);
    for (const Rows& r : subsets) {
      std::vector<float> c(p.c0.begin() + r.first * p.ldc, p.c0.begin() + (r.first + r.count) * p.ldc);
      GemmArgs<In, float> g;
      g.m = r.count, g.n = p.n, g.k = p.k;
      g.a = p.a.data() + (p.ta ? r.first : r.first * p.lda), g.lda = p.lda, g.trans_a = p.ta;
      g.b = p.b.data(), g.ldb = p.ldb, g.trans_b = p.tb;
      g.c = c.data(), g.ldc = p.ldc, g.accumulate = p.accumulate;
      gemm(g);
      ASSERT_EQ(0, std::memcmp(c.data(), all.data() + r.first * p.ldc, c.size() * sizeof(float)))
          << p.str() << " rows " << r.first << "+" << r.count;
    }
  }
}

TEST_P(GemmVariant, F32RowsAreTheSameInAnyBatch) {
  if (GetParam().f32 == nullptr) GTEST_SKIP() << "no f32 GEMM at this level";
  check_row_subsets<float>(GetParam().f32);
}

TEST_P(GemmVariant, Bf16RowsAreTheSameInAnyBatch) {
  check_row_subsets<bf16>(GetParam().bf16);
}

TEST_P(GemmVariant, F32ZeroKPaddingBitIdentical) {
  if (GetParam().f32 == nullptr) GTEST_SKIP() << "no f32 GEMM at this level";
  check_zero_k_padding<float>(GetParam().f32);
}

TEST_P(GemmVariant, Bf16ZeroKPaddingBitIdentical) {
  check_zero_k_padding<bf16>(GetParam().bf16);
}

TEST_P(GemmVariant, EmptyAndZeroK) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> c(12, nan);
  GemmArgs<bf16, float> g;
  g.m = 3, g.n = 4, g.k = 0, g.c = c.data(), g.ldc = 4;
  GetParam().bf16(g);  // k = 0 overwrites with zeros, without needing a or b
  for (float x : c) EXPECT_EQ(0.0f, x);
  c.assign(12, 2.5f);
  g.accumulate = true;
  GetParam().bf16(g);
  for (float x : c) EXPECT_EQ(2.5f, x);
  g.m = 0, g.k = 5;
  GetParam().bf16(g);  // nothing to write: a and b may be null
  for (float x : c) EXPECT_EQ(2.5f, x);
}

TEST_P(GemmVariant, RejectsBadArguments) {
  std::vector<bf16> a(64), b(64);
  std::vector<float> c(64);
  GemmArgs<bf16, float> g;
  g.m = 4, g.n = 4, g.k = 4;
  g.a = a.data(), g.lda = 4, g.b = b.data(), g.ldb = 4, g.c = c.data(), g.ldc = 4;
  GetParam().bf16(g);
  GemmArgs<bf16, float> bad = g;
  bad.lda = 3;
  EXPECT_THROW(GetParam().bf16(bad), Error);
  bad = g;
  bad.trans_b = true, bad.ldb = 3;
  EXPECT_THROW(GetParam().bf16(bad), Error);
  bad = g;
  bad.ldc = 2;
  EXPECT_THROW(GetParam().bf16(bad), Error);
  bad = g;
  bad.k = -1;
  EXPECT_THROW(GetParam().bf16(bad), Error);
  bad = g;
  bad.a = nullptr;
  EXPECT_THROW(GetParam().bf16(bad), Error);
}

INSTANTIATE_TEST_SUITE_P(Isa, GemmVariant, ::testing::ValuesIn(kVariants),
                         [](const ::testing::TestParamInfo<Variant>& info) {
                           return std::string(info.param.name);
                         });

TEST(GemmReference, F64SmallProductsAndTransposes) {
  // [[1, 2, 3], [4, 5, 6]] · [[7, 8], [9, 10], [11, 12]] = [[58, 64], [139, 154]].
  const double a[] = {1, 2, 3, 4, 5, 6}, at[] = {1, 4, 2, 5, 3, 6};
  const double b[] = {7, 8, 9, 10, 11, 12}, bt[] = {7, 9, 11, 8, 10, 12};
  for (int trans = 0; trans < 4; ++trans) {
    double c[4] = {1, 1, 1, 1};
    GemmArgs<double, double> g;
    g.m = 2, g.n = 2, g.k = 3;
    g.trans_a = trans & 1, g.trans_b = trans & 2;
    g.a = g.trans_a ? at : a, g.lda = g.trans_a ? 2 : 3;
    g.b = g.trans_b ? bt : b, g.ldb = g.trans_b ? 3 : 2;
    g.c = c, g.ldc = 2, g.accumulate = trans == 3;
    reference::gemm_f64(g);
    const double add = trans == 3 ? 1 : 0;
    EXPECT_EQ(58 + add, c[0]);
    EXPECT_EQ(64 + add, c[1]);
    EXPECT_EQ(139 + add, c[2]);
    EXPECT_EQ(154 + add, c[3]);
  }
}

TEST(GemmProbe, ReportsPositiveRates) {
  KernelTable t;
  t.gemm_f32 = reference::gemm_f32, t.gemm_bf16 = reference::gemm_bf16, t.gemm_f64 = reference::gemm_f64;
  EXPECT_GT(measure_gemm_gflops(t, DType::f32, 32, 48, 40, 0.01), 0.0);
  EXPECT_GT(measure_gemm_gflops(t, DType::bf16, 17, 33, 9, 0.01), 0.0);
  EXPECT_GT(measure_gemm_gflops(t, DType::f64, 8, 8, 8, 0.01), 0.0);
  EXPECT_THROW(measure_gemm_gflops(t, DType::f32, 0, 8, 8, 0.01), Error);
  t.gemm_bf16 = nullptr;
  EXPECT_THROW(measure_gemm_gflops(t, DType::bf16, 8, 8, 8, 0.01), Error);
}

// The AVX-512 levels' f32 GEMM keeps its op(B) blocks in L2 from a 2 MiB L2 on; below (Zen 4's 1 MiB) the L3
// blocks; the bf16 GEMMs of the higher levels are the same either way.
TEST(GemmTable, Avx512BlockingFollowsTheL2Size) {
  CpuFeatures f = detect_cpu_features();
  if (!f.has_avx512()) GTEST_SKIP() << "no AVX-512 on this CPU";
  for (const Isa isa : {Isa::avx512, Isa::avx512_bf16, Isa::amx}) {
    if (!isa_supported(f, isa)) continue;
    f.l2_bytes = int64_t{2} << 20;
    const KernelTable& big = kernel_table(isa, f);
    EXPECT_EQ(big.gemm_f32, avx512::gemm_f32_l2_blocks) << isa_name(isa);
    EXPECT_EQ(kernel_table(isa, f, MatmulPrecision::medium).gemm_f32, avx512::gemm_f32_l2_blocks)
        << isa_name(isa);
    f.l2_bytes = int64_t{1} << 20;
    const KernelTable& small = kernel_table(isa, f);
    EXPECT_EQ(small.gemm_f32, avx512::gemm_f32) << isa_name(isa);
    EXPECT_EQ(kernel_table(isa, f, MatmulPrecision::medium).gemm_f32, avx512::gemm_f32) << isa_name(isa);
    if (isa != Isa::avx512) {
      EXPECT_EQ(big.gemm_bf16, small.gemm_bf16) << isa_name(isa);
    }
  }
  f.l2_bytes = 0;  // not reported
  EXPECT_EQ(kernel_table(Isa::avx512, f).gemm_f32, avx512::gemm_f32);
}

// The CPU-time clock (gemm_bench --clock thread) times the one calling thread; more threads are refused.
TEST(RegisterPeak, ThreadCpuClockNeedsOneThread) {
  const CpuFeatures f = detect_cpu_features();
  EXPECT_GT(register_fma_peak_gflops(Isa::reference, f, 1, 0.01, PeakClock::thread_cpu), 0.0);
  EXPECT_THROW(register_fma_peak_gflops(Isa::reference, f, 2, 0.01, PeakClock::thread_cpu), Error);
  if (f.has_avx512_bf16()) {
    EXPECT_GT(register_bf16_dot_peak_gflops(f, 1, 0.01, PeakClock::thread_cpu), 0.0);
    EXPECT_THROW(register_bf16_dot_peak_gflops(f, 2, 0.01, PeakClock::thread_cpu), Error);
  }
}

}  // namespace
}  // namespace xmoe::kernels
