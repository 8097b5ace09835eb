#include "moe/routing.hpp"

#include <algorithm>
#include <cmath>

#include "xmoe/error.hpp"

namespace xmoe::moe {

template <class Acc>
void select_top_k(const Acc* scores, int64_t tokens, int num_experts, int k, int32_t* ids) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < tokens; ++t) {
    const Acc* s = scores + t * num_experts;
    // Insertion into a sorted list of the best k keeps ties in index order: a later expert must be
    // strictly greater to move ahead of an earlier one.
    int32_t best[256];
    Acc best_score[256];
    int32_t* sel = best;
    Acc* sel_score = best_score;
    std::vector<int32_t> big_ids;
    std::vector<Acc> big_scores;
    if (k > 256) {
      big_ids.resize(static_cast<size_t>(k));
      big_scores.resize(static_cast<size_t>(k));
      sel = big_ids.data();
      sel_score = big_scores.data();
    }
    int n = 0;
    for (int e = 0; e < num_experts; ++e) {
      const Acc v = s[e];
      if (n == k && !(v > sel_score[k - 1])) continue;
      int pos = n < k ? n : k - 1;
      while (pos > 0 && v > sel_score[pos - 1]) {
        sel[pos] = sel[pos - 1];
        sel_score[pos] = sel_score[pos - 1];
        --pos;
      }
      sel[pos] = e;
      sel_score[pos] = v;
      if (n < k) ++n;
    }
    for (int j = 0; j < k; ++j) ids[j * tokens + t] = sel[j];
  }
}
template void select_top_k<float>(const float*, int64_t, int, int, int32_t*);
template void select_top_k<double>(const double*, int64_t, int, int, int32_t*);

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
