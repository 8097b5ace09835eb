#include "moe/routed_experts.hpp"

#include <algorithm>

#include "moe/parallel.hpp"
#include "xmoe/error.hpp"

namespace xmoe::moe {

RoutedExperts::RoutedExperts(std::vector<SwigluWeights> experts, const kernels::KernelTable& table,
                             const ExpertDescriptor& descriptor)
    : table_(&table), experts_(std::move(experts), table, descriptor) {}

void RoutedExperts::forward(const float* x, int64_t T, int k, const int32_t* ids, const float* weights,
                            float* y) {
  forward(x, T, k, ids, weights, y, own_);
}

void RoutedExperts::forward(const float* x, int64_t T, int k, const int32_t* ids, const float* weights,
                            float* y, ExpertScratch& scratch) {
  const int E = experts_.num_experts();
  const int64_t M = experts_.model_dim();
  XMOE_CHECK(T >= 0 && k >= 1 && k <= E, "routed experts: top_k must be in [1, ", E, "], got ", k);
  if (T == 0) return;
  // Tutel's routing data is choice-major [k, T].
  const auto kT = static_cast<size_t>(k * T);
  ids_.resize(kT);
  locations_.resize(kT);
  counts_.resize(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t)
    for (int j = 0; j < k; ++j) {
      const int32_t e = ids[t * k + j];
      XMOE_CHECK(e >= 0 && e < E, "routed experts: expert id ", e, " of token ", t, " out of range [0, ", E,
                 ")");
      ids_[static_cast<size_t>(j * T + t)] = e;
    }
  compute_locations(ids_.data(), T, E, k, nullptr, locations_.data(), counts_.data());
  const int64_t max_count = *std::max_element(counts_.begin(), counts_.end());
  const int64_t capacity = compute_capacity(0.0, k, T, E, max_count, 1);  // dropless
  plan_rows(ids_.data(), locations_.data(), counts_.data(), T, E, k, capacity, ExpertExecution::grouped,
            plan_);
  XMOE_CHECK(plan_.dropped == 0, "routed experts: dropless plan dropped ", plan_.dropped, " token copies");

  const int64_t R = plan_.total_rows;
  float* disp = scratch.dispatched.ensure(static_cast<size_t>(R * M));
  parallel_rows(T, 16, [&](int64_t a, int64_t b) {
    for (int64_t t = a; t < b; ++t)
      for (int j = 0; j < k; ++j) {
        const int64_t row = plan_.row_of[static_cast<size_t>(j * T + t)];
        std::copy(x + t * M, x + (t + 1) * M, disp + row * M);
      }
  });
  ranges_.clear();
  for (int e = 0; e < E; ++e)
    ranges_.push_back({e, plan_.offsets[static_cast<size_t>(e)], plan_.offsets[static_cast<size_t>(e) + 1]});
  float* yd = scratch.expert_out.ensure(static_cast<size_t>(R * M));
  experts_.forward_rows(disp, ranges_, R, yd, scratch);
  parallel_rows(T, 16, [&](int64_t a, int64_t b) {
    for (int64_t t = a; t < b; ++t) {
      float* out = y + t * M;
      std::fill(out, out + M, 0.0f);
      for (int j = 0; j < k; ++j) {
        const int64_t row = plan_.row_of[static_cast<size_t>(j * T + t)];
        table_->axpy_f32(weights[t * k + j], yd + row * M, out, M);
      }
    }
  });
}

}  // namespace xmoe::moe
