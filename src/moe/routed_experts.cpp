#include "moe/routed_experts.hpp"

#include <algorithm>

#include "moe/parallel.hpp"
#include "xmoe/error.hpp"

namespace xmoe::moe {

template <class S>
RoutedExperts<S>::RoutedExperts(const MoeConfig& config, const kernels::KernelTable& table)
    : config_(config) {
  XMOE_CHECK(config.dtype == dtype_of<S>(), "routed experts: config.dtype ", dtype_name(config.dtype),
             " does not match the experts' storage type ", dtype_name(dtype_of<S>()));
  XMOE_CHECK(config.experts.num_experts > 0, "routed experts: experts.num_experts must be > 0, got ",
             config.experts.num_experts);
  XMOE_CHECK(config.model_dim > 0 && config.experts.hidden_size > 0,
             "routed experts: model_dim and experts.hidden_size must be > 0");
  XMOE_CHECK(config.experts.type == "swiglu", "routed experts: experts.type must be swiglu, got '",
             config.experts.type, "'");
  ops_.k = &table;
  ExpertShard shard = whole_model_shard(config);
  shard.inference_only = true;
  experts_ = make_experts<S>(config, shard, params_);
}

template <class S>
Parameter& RoutedExperts<S>::parameter(const std::string& name) {
  for (auto& p : params_)
    if (p->name == name) return *p;
  throw Error("routed experts: no parameter named '" + name + "'");
}

template <class S>
void RoutedExperts<S>::forward(const S* x, int64_t T, int k, const int32_t* ids, const float* weights,
                               Acc* y) {
  const int E = config_.experts.num_experts;
  const int64_t M = config_.model_dim, O = experts_->output_dim();
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
  S* disp = dispatched_.ensure(static_cast<size_t>(R * M));
  parallel_rows(T, 16, [&](int64_t a, int64_t b) {
    for (int64_t t = a; t < b; ++t)
      for (int j = 0; j < k; ++j) {
        const int64_t row = plan_.row_of[static_cast<size_t>(j * T + t)];
        std::copy(x + t * M, x + (t + 1) * M, disp + row * M);
      }
  });
  S* yd = expert_out_.ensure(static_cast<size_t>(R * O));
  experts_->forward(ops_, disp, plan_.offsets, yd);
  parallel_rows(T, 16, [&](int64_t a, int64_t b) {
    for (int64_t t = a; t < b; ++t) {
      Acc* out = y + t * O;
      std::fill(out, out + O, Acc(0));
      for (int j = 0; j < k; ++j) {
        const int64_t row = plan_.row_of[static_cast<size_t>(j * T + t)];
        ops_.axpy_row(static_cast<Acc>(weights[t * k + j]), yd + row * O, out, O);
      }
    }
  });
}

template class RoutedExperts<float>;
template class RoutedExperts<bf16>;

}  // namespace xmoe::moe
