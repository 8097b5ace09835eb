// Scalar row-wise top-k, the oracle of topk_avx2.cpp and topk_avx512.cpp: insertion into a sorted list of the
// best k, where a later column must be strictly better to move ahead of an earlier one, so equal scores keep
// column order. "Better" is torch.topk's order: NaN above everything (NaNs equal among themselves), then the
// usual float order, in which −0 == +0.
#include <cmath>
#include <vector>

#include "kernels/cpu/variants.hpp"
#include "xmoe/error.hpp"

namespace xmoe::kernels::reference {

namespace {

// a strictly before b: a > b, or a is NaN and b is not.
inline bool better(float a, float b) {
  return a > b || (std::isnan(a) && !std::isnan(b));
}

}  // namespace

void topk_rows_f32(const float* scores, int64_t rows, int64_t cols, int k, int32_t* ids, int64_t ids_stride) {
  XMOE_CHECK(k >= 1 && k <= cols, "topk_rows_f32: k = ", k, " outside [1, cols = ", cols, "]");
  XMOE_CHECK(cols <= INT32_MAX, "topk_rows_f32: cols = ", cols, " does not fit int32 ids");
  XMOE_CHECK(rows >= 0, "topk_rows_f32: rows = ", rows);
  XMOE_CHECK(k == 1 || ids_stride >= rows, "topk_rows_f32: ids_stride = ", ids_stride, " < rows = ", rows);
  std::vector<int32_t> sel(static_cast<size_t>(k));
  std::vector<float> sel_score(static_cast<size_t>(k));
  for (int64_t r = 0; r < rows; ++r) {
    const float* s = scores + r * cols;
    int n = 0;
    for (int64_t c = 0; c < cols; ++c) {
      const float v = s[c];
      if (n == k && !better(v, sel_score[static_cast<size_t>(k - 1)])) continue;
      int pos = n < k ? n : k - 1;
      while (pos > 0 && better(v, sel_score[static_cast<size_t>(pos - 1)])) {
        sel[static_cast<size_t>(pos)] = sel[static_cast<size_t>(pos - 1)];
        sel_score[static_cast<size_t>(pos)] = sel_score[static_cast<size_t>(pos - 1)];
        --pos;
      }
      sel[static_cast<size_t>(pos)] = static_cast<int32_t>(c);
      sel_score[static_cast<size_t>(pos)] = v;
      if (n < k) ++n;
    }
    for (int j = 0; j < k; ++j) ids[j * ids_stride + r] = sel[static_cast<size_t>(j)];
  }
}

}  // namespace xmoe::kernels::reference
