// Row-wise top-k (routing): every vector variant must return the reference's ids exactly, and the reference
// must equal a stable sort by torch.topk's order (NaN first, −0 == +0, ties to the lower column).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/variants.hpp"
#include "kernels/cpu_features.hpp"
#include "xmoe/error.hpp"

namespace xmoe::kernels {
namespace {

using TopK = void (*)(const float*, int64_t, int64_t, int, int32_t*, int64_t);

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr int32_t kUnwritten = -7;
const int64_t kCols[] = {1, 2, 3, 4, 7, 8, 9, 15, 16, 17, 31, 32, 33, 64, 100, 128, 256, 384};

enum class Fill { uniform, ties, neg_inf, nan, mixed };
const Fill kFills[] = {Fill::uniform, Fill::ties, Fill::neg_inf, Fill::nan, Fill::mixed};

const char* fill_name(Fill f) {
  switch (f) {
    case Fill::uniform:
      return "uniform";
    case Fill::ties:
      return "ties";
    case Fill::neg_inf:
      return "neg_inf";
    case Fill::nan:
      return "nan";
    case Fill::mixed:
      return "mixed";
  }
  return "?";
}

// rows × cols scores of one kind. Some rows of the special kinds are entirely −inf, NaN or one tied value.
std::vector<float> make_scores(int64_t rows, int64_t cols, Fill fill, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uni(-4.0f, 4.0f);
  std::uniform_int_distribution<int> pick(0, 99);
  const float tiny_set[] = {-1.0f, -0.0f, 0.0f, 0.5f, 0.5f, 2.0f};
  const float specials[] = {kInf, -kInf, kNaN, -kNaN, 0.0f, -0.0f, 1e-45f, -1e-45f, 3.4e38f, -3.4e38f};
  std::vector<float> s(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    const int mode = static_cast<int>(r % 7);  // rows with mode 6 are uniform over the whole row
    for (int64_t c = 0; c < cols; ++c) {
      float& x = s[static_cast<size_t>(r * cols + c)];
      const int p = pick(rng);
      switch (fill) {
        case Fill::uniform:
          x = uni(rng);
          break;
        case Fill::ties:
          x = mode == 6 ? 0.5f : tiny_set[p % 6];
          break;
        case Fill::neg_inf:
          x = mode == 6 ? -kInf : (p < 60 ? -kInf : uni(rng));
          break;
        case Fill::nan:
          x = mode == 6 ? (p < 50 ? kNaN : -kNaN)
                        : (p < 20   ? kNaN
                           : p < 30 ? -kNaN
                           : p < 40 ? kInf
                                    : uni(rng));
          break;
        case Fill::mixed:
          x = p < 30 ? specials[p % 10] : p < 60 ? tiny_set[p % 6] : uni(rng);
          break;
      }
    }
  }
  return s;
}

// The distinct k to test for a column count: 1, 2, min(8, cols), cols.
std::vector<int> ks_for(int64_t cols) {
  std::vector<int> ks = {1, 2, static_cast<int>(std::min<int64_t>(8, cols)), static_cast<int>(cols)};
  ks.erase(std::remove_if(ks.begin(), ks.end(), [cols](int k) { return k > cols; }), ks.end());
  std::sort(ks.begin(), ks.end());
  ks.erase(std::unique(ks.begin(), ks.end()), ks.end());
  return ks;
}

// Runs fn into a [k, stride] buffer with stride > rows, so that writes past the rows would show.
std::vector<int32_t> run(TopK fn, const std::vector<float>& s, int64_t rows, int64_t cols, int k) {
  const int64_t stride = rows + 5;
  std::vector<int32_t> ids(static_cast<size_t>(k * stride), kUnwritten);
  fn(s.data(), rows, cols, k, ids.data(), stride);
  return ids;
}

// The definition: a stable sort by "a before b" = a > b, or a is NaN and b is not.
std::vector<int32_t> sorted_ids(const float* row, int64_t cols) {
  std::vector<int32_t> idx(static_cast<size_t>(cols));
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [row](int32_t a, int32_t b) {
    const float x = row[a], y = row[b];
    return x > y || (std::isnan(x) && !std::isnan(y));
  });
  return idx;
}

TEST(TopKReference, MatchesStableSort) {
  const int64_t rows = 23;
  for (int64_t cols : kCols) {
    for (Fill fill : kFills) {
      const auto s = make_scores(rows, cols, fill, static_cast<uint32_t>(cols * 31 + static_cast<int>(fill)));
      for (int k : ks_for(cols)) {
        const auto ids = run(reference::topk_rows_f32, s, rows, cols, k);
        const int64_t stride = rows + 5;
        for (int64_t r = 0; r < rows; ++r) {
          const auto want = sorted_ids(s.data() + r * cols, cols);
          for (int j = 0; j < k; ++j) {
            ASSERT_EQ(ids[static_cast<size_t>(j * stride + r)], want[static_cast<size_t>(j)])
                << "cols " << cols << " k " << k << " " << fill_name(fill) << " row " << r << " j " << j;
          }
        }
        for (int j = 0; j < k; ++j) {
          for (int64_t r = rows; r < stride; ++r)
            ASSERT_EQ(ids[static_cast<size_t>(j * stride + r)], kUnwritten);
        }
      }
    }
  }
}

TEST(TopKReference, HandPickedRows) {
  // NaN first (lower index among NaNs), then +inf, numbers, −0 == +0 in column order, −inf last.
  const float row[] = {-kInf, 0.0f, kNaN, -0.0f, kInf, -kNaN, 1.0f, -kInf, -0.0f};
  int32_t ids[9];
  reference::topk_rows_f32(row, 1, 9, 9, ids, 1);
  const int32_t want[] = {2, 5, 4, 6, 1, 3, 8, 0, 7};
  for (int j = 0; j < 9; ++j) EXPECT_EQ(ids[j], want[j]) << j;
  // All −inf: column order.
  const float all_neg_inf[] = {-kInf, -kInf, -kInf, -kInf};
  int32_t ids4[4];
  reference::topk_rows_f32(all_neg_inf, 1, 4, 4, ids4, 1);
  for (int j = 0; j < 4; ++j) EXPECT_EQ(ids4[j], j);
}

TEST(TopKReference, RejectsBadK) {
  const float row[4] = {1, 2, 3, 4};
  int32_t ids[8];
  EXPECT_THROW(reference::topk_rows_f32(row, 1, 4, 0, ids, 1), Error);
  EXPECT_THROW(reference::topk_rows_f32(row, 1, 4, 5, ids, 1), Error);
  EXPECT_THROW(reference::topk_rows_f32(row, 1, 0, 1, ids, 1), Error);
  EXPECT_NO_THROW(reference::topk_rows_f32(row, 1, 4, 4, ids, 1));
}

class TopKVariants : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!isa_supported(detect_cpu_features(), GetParam())) {
      GTEST_SKIP() << isa_name(GetParam()) << " is not supported on this CPU";
    }
    fn = kernel_table(GetParam(), detect_cpu_features()).topk_rows_f32;
    ASSERT_NE(fn, nullptr);
  }
  TopK fn = nullptr;
};

TEST_P(TopKVariants, TableHoldsTheVariant) {
  const TopK want = GetParam() == Isa::avx2 ? avx2::topk_rows_f32 : avx512::topk_rows_f32;
  EXPECT_EQ(fn, want);
  EXPECT_EQ(reference_kernel_table().topk_rows_f32, reference::topk_rows_f32);
}

TEST_P(TopKVariants, MatchesReference) {
  // Row counts that are and are not multiples of the rows packed per register (16 / G).
  for (int64_t rows : {1, 3, 8, 37}) {
    for (int64_t cols : kCols) {
      for (Fill fill : kFills) {
        const auto s = make_scores(rows, cols, fill,
                                   static_cast<uint32_t>(rows * 1000 + cols * 31 + static_cast<int>(fill)));
        for (int k : ks_for(cols)) {
          const auto want = run(reference::topk_rows_f32, s, rows, cols, k);
          const auto got = run(fn, s, rows, cols, k);
          for (size_t i = 0; i < want.size(); ++i) {
            ASSERT_EQ(got[i], want[i])
                << "rows " << rows << " cols " << cols << " k " << k << " " << fill_name(fill) << " row "
                << i % static_cast<size_t>(rows + 5) << " j " << i / static_cast<size_t>(rows + 5);
          }
        }
      }
    }
  }
}

TEST_P(TopKVariants, EveryColumnCountUpTo40) {
  const int64_t rows = 19;
  for (int64_t cols = 1; cols <= 40; ++cols) {
    for (Fill fill : {Fill::ties, Fill::mixed}) {
      const auto s = make_scores(rows, cols, fill, static_cast<uint32_t>(cols + 77));
      for (int k = 1; k <= cols; ++k) {
        const auto want = run(reference::topk_rows_f32, s, rows, cols, k);
        ASSERT_EQ(run(fn, s, rows, cols, k), want) << "cols " << cols << " k " << k << " " << fill_name(fill);
      }
    }
  }
}

TEST_P(TopKVariants, WideRowsUseTheHeapBuffer) {
  const int64_t rows = 5;
  for (int64_t cols : {1023, 1024, 1025, 1500}) {
    for (Fill fill : {Fill::uniform, Fill::ties, Fill::neg_inf, Fill::nan}) {
      const auto s = make_scores(rows, cols, fill, static_cast<uint32_t>(cols));
      for (int k : {1, 8, 40}) {
        ASSERT_EQ(run(fn, s, rows, cols, k), run(reference::topk_rows_f32, s, rows, cols, k))
            << "cols " << cols << " k " << k << " " << fill_name(fill);
      }
    }
  }
}

TEST_P(TopKVariants, AllTakenThenNegInf) {
  // The best scores are taken first; what is left is −inf only, which must still come in column order.
  for (int64_t cols : {5, 8, 13, 16, 40, 130}) {
    std::vector<float> s(static_cast<size_t>(3 * cols), -kInf);
    for (int64_t r = 0; r < 3; ++r) s[static_cast<size_t>(r * cols + (r * 7) % cols)] = 1.0f;
    s[static_cast<size_t>(cols - 1)] = kNaN;
    const int k = static_cast<int>(cols);
    const auto want = run(reference::topk_rows_f32, s, 3, cols, k);
    ASSERT_EQ(run(fn, s, 3, cols, k), want) << "cols " << cols;
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, TopKVariants, ::testing::Values(Isa::avx2, Isa::avx512),
                         [](const ::testing::TestParamInfo<Isa>& info) {
                           return std::string(isa_name(info.param));
                         });

}  // namespace
}  // namespace xmoe::kernels
