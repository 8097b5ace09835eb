// Routing ("critical data" in Tutel): top-k selection, slot locations in Tutel's order, capacity, and the row
// plan that maps each kept token copy to a row of the dispatch buffer (padded [E, C] or grouped by expert).
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/kernels.hpp"
#include "xmoe/moe_layer.hpp"

namespace xmoe::moe {

// ids[j * T + t] = the j-th best expert of token t (descending score; ties go to the lower expert index; NaN
// ranks first, as in torch.topk). f32 runs the kernel table's top-k; f64 a plain loop with the same order.
void select_top_k(const kernels::KernelTable& table, const float* scores, int64_t tokens, int num_experts,
                  int k, int32_t* ids);
void select_top_k(const kernels::KernelTable& table, const double* scores, int64_t tokens, int num_experts,
                  int k, int32_t* ids);

// Tutel's locations: all first choices in token order (or in `order`, the batch-prioritized token order),
// then all second choices, ... Fills locations [k, T] and counts [E] (every choice counted, before drops).
void compute_locations(const int32_t* ids, int64_t tokens, int num_experts, int k, const int64_t* order,
                       int32_t* locations, int32_t* counts);

// C from the capacity factor: > 0: k·int(cf·ceil(T/E)); 0: max count; < 0: min(max count,
// k·int(−cf·ceil(T/E))); then rounded up to a multiple of alignment.
int64_t compute_capacity(double capacity_factor, int k, int64_t tokens, int num_experts, int64_t max_count,
                         int64_t alignment);

// Where each expert's rows start in the dispatch buffer and how many rows each runs.
struct RowPlan {
  std::vector<int64_t> offsets;  // [E + 1]
  std::vector<int64_t> rows;     // [E]: C (padded) or min(count, C) (grouped)
  std::vector<int64_t> filled;   // [E]: min(count, C): rows that hold a token copy
  std::vector<int64_t> row_of;   // [k, T]: buffer row of each copy, −1 if dropped
  int64_t total_rows = 0;
  int64_t dropped = 0;
};
void plan_rows(const int32_t* ids, const int32_t* locations, const int32_t* counts, int64_t tokens,
               int num_experts, int k, int64_t capacity, ExpertExecution execution, RowPlan& plan);

}  // namespace xmoe::moe
