#include "moe/routing.hpp"

#include <algorithm>
#include <cmath>

#include "moe/parallel.hpp"
#include "xmoe/error.hpp"

namespace xmoe::moe {

void select_top_k(const kernels::KernelTable& table, const float* scores, int64_t tokens, int num_experts,
                  int k, int32_t* ids) {
  parallel_rows(tokens, 64, [&](int64_t t0, int64_t t1) {
    table.topk_rows_f32(scores + t0 * num_experts, t1 - t0, num_experts, k, ids + t0, tokens);
  });
}

void select_top_k(const kernels::KernelTable&, const double* scores, int64_t tokens, int num_experts, int k,
                  int32_t* ids) {
  // NaN above everything, then plain order; a later expert must rank strictly higher to move ahead.
  auto ranks_above = [](double a, double b) { return a > b || (std::isnan(a) && !std::isnan(b)); };
  std::vector<int32_t> sel(static_cast<size_t>(k));
  std::vector<double> val(static_cast<size_t>(k));
  for (int64_t t = 0; t < tokens; ++t) {
    const double* s = scores + t * num_experts;
    int n = 0;
    for (int e = 0; e < num_experts; ++e) {
      const double v = s[e];
      if (n == k && !ranks_above(v, val[static_cast<size_t>(k - 1)])) continue;
      int pos = n < k ? n : k - 1;
      while (pos > 0 && ranks_above(v, val[static_cast<size_t>(pos - 1)])) {
        sel[static_cast<size_t>(pos)] = sel[static_cast<size_t>(pos - 1)];
        val[static_cast<size_t>(pos)] = val[static_cast<size_t>(pos - 1)];
        --pos;
      }
      sel[static_cast<size_t>(pos)] = e;
      val[static_cast<size_t>(pos)] = v;
      if (n < k) ++n;
    }
    for (int j = 0; j < k; ++j) ids[j * tokens + t] = sel[static_cast<size_t>(j)];
  }
}

void compute_locations(const int32_t* ids, int64_t tokens, int num_experts, int k, const int64_t* order,
                       int32_t* locations, int32_t* counts) {
  std::fill(counts, counts + num_experts, 0);
  for (int j = 0; j < k; ++j) {
    const int32_t* id = ids + j * tokens;
    int32_t* loc = locations + j * tokens;
    for (int64_t i = 0; i < tokens; ++i) {
      const int64_t t = order ? order[i] : i;
      const int32_t e = id[t];
      XMOE_CHECK(e >= 0 && e < num_experts, "routing: expert id ", e, " of token ", t, " outside [0, ",
                 num_experts, ")");
      loc[t] = counts[e]++;
    }
  }
}

int64_t compute_capacity(double capacity_factor, int k, int64_t tokens, int num_experts, int64_t max_count,
                         int64_t alignment) {
  const int64_t spe = (tokens + num_experts - 1) / num_experts;
  int64_t c;
  if (capacity_factor > 0) {
    c = k * static_cast<int64_t>(capacity_factor * static_cast<double>(spe));
  } else {
    c = max_count;
    if (capacity_factor < 0)
      c = std::min(c, k * static_cast<int64_t>(-capacity_factor * static_cast<double>(spe)));
  }
  if (alignment > 1 && c % alignment) c += alignment - c % alignment;
  return c;
}

void plan_rows(const int32_t* ids, const int32_t* locations, const int32_t* counts, int64_t tokens,
               int num_experts, int k, int64_t capacity, ExpertExecution execution, RowPlan& plan) {
  const auto E = static_cast<size_t>(num_experts);
  plan.offsets.resize(E + 1);
  plan.rows.resize(E);
  plan.filled.resize(E);
  plan.row_of.resize(static_cast<size_t>(k * tokens));
  plan.offsets[0] = 0;
  for (size_t e = 0; e < E; ++e) {
    plan.filled[e] = std::min<int64_t>(counts[e], capacity);
    plan.rows[e] = execution == ExpertExecution::padded ? capacity : plan.filled[e];
    plan.offsets[e + 1] = plan.offsets[e] + plan.rows[e];
  }
  plan.total_rows = plan.offsets[E];
  int64_t dropped = 0;
  for (int64_t i = 0; i < k * tokens; ++i) {
    const int32_t loc = locations[i];
    if (loc < capacity) {
      plan.row_of[static_cast<size_t>(i)] = plan.offsets[static_cast<size_t>(ids[i])] + loc;
    } else {
      plan.row_of[static_cast<size_t>(i)] = -1;
      ++dropped;
    }
  }
  plan.dropped = dropped;
}

}  // namespace xmoe::moe
