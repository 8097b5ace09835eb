#include "moe/linear_router.hpp"

#include "kernels/linear.hpp"
#include "moe/parallel.hpp"
#include "xmoe/error.hpp"

namespace xmoe::moe {

LinearRouter::LinearRouter(kernels::PackedWeight weight, std::vector<float> bias,
                           const LlmRouterConfig& config, const kernels::KernelTable& table,
                           std::vector<float> correction_bias)
    : weight_(weight),
      bias_(std::move(bias)),
      correction_bias_(std::move(correction_bias)),
      config_(config),
      table_(&table) {
  validate(config_);
  const auto E = static_cast<size_t>(config_.num_experts);
  XMOE_CHECK(weight_.rows == config_.num_experts, "router: weight has ", weight_.rows, " rows, expected ",
             config_.num_experts, " (num_experts)");
  XMOE_CHECK(bias_.empty() || bias_.size() == E, "router: bias has ", bias_.size(), " values, expected ", E);
  XMOE_CHECK(correction_bias_.empty() || correction_bias_.size() == E, "router: correction bias has ",
             correction_bias_.size(), " values, expected ", E);
}

void LinearRouter::route(const float* x, int64_t T, int32_t* ids, float* weights) {
  const int64_t E = config_.num_experts;
  float* logits = logits_.ensure(static_cast<size_t>(T * E));
  kernels::linear_forward(*table_, weight_, x, T, logits);
  if (!bias_.empty())
    parallel_rows(T, 64, [&](int64_t a, int64_t b) {
      for (int64_t t = a; t < b; ++t)
        for (int64_t e = 0; e < E; ++e) logits[t * E + e] += bias_[static_cast<size_t>(e)];
    });
  llm_route(config_, logits, correction_bias_.empty() ? nullptr : correction_bias_.data(), T, ids, weights);
}

}  // namespace xmoe::moe
