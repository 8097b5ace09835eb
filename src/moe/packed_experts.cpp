#include "moe/packed_experts.hpp"

#include "kernels/linear.hpp"
#include "moe/parallel.hpp"
#include "xmoe/error.hpp"

namespace xmoe::moe {

PackedSwigluExperts::PackedSwigluExperts(std::vector<SwigluWeights> experts,
                                         const kernels::KernelTable& table)
    : table_(&table), experts_(std::move(experts)) {
  XMOE_CHECK(!experts_.empty(), "packed experts: no experts");
  model_dim_ = experts_[0].gate.cols;
  hidden_ = experts_[0].gate.rows;
  for (size_t e = 0; e < experts_.size(); ++e) {
    const SwigluWeights& w = experts_[e];
    XMOE_CHECK(w.gate.rows == hidden_ && w.gate.cols == model_dim_ && w.up.rows == hidden_ &&
                   w.up.cols == model_dim_ && w.down.rows == model_dim_ && w.down.cols == hidden_,
               "packed experts: expert ", e, " has gate [", w.gate.rows, ", ", w.gate.cols, "], up [",
               w.up.rows, ", ", w.up.cols, "], down [", w.down.rows, ", ", w.down.cols,
               "]; expected gate and up [", hidden_, ", ", model_dim_, "], down [", model_dim_, ", ", hidden_,
               "]");
    const kernels::PackedWeight parts[] = {w.gate, w.up};
    const auto joined = kernels::join_rows(parts);
    joined_.push_back(joined ? 1 : 0);
    gate_up_.push_back(joined ? *joined : kernels::PackedWeight{});
  }
}

void PackedSwigluExperts::forward_rows(const float* x, std::span<const ExpertRange> ranges, int64_t R,
                                       float* y) {
  const int64_t M = model_dim_, I = hidden_;
  // Gate and up outputs side by side: row i holds gate [0, I) then up [I, 2I).
  float* gu = gu_.ensure(static_cast<size_t>(R * 2 * I));
  float* act = act_.ensure(static_cast<size_t>(R * I));
  for (const ExpertRange& rg : ranges) {
    const int64_t r0 = rg.begin, r = rg.end - rg.begin;
    XMOE_CHECK(rg.expert >= 0 && rg.expert < num_experts() && r0 >= 0 && r >= 0 && rg.end <= R,
               "packed experts: bad row range");
    if (r == 0) continue;
    const auto e = static_cast<size_t>(rg.expert);
    const SwigluWeights& w = experts_[e];
    const float* xe = x + r0 * M;
    float* g = gu + r0 * 2 * I;
    if (joined_[e]) {
      kernels::linear_forward(*table_, gate_up_[e], xe, r, M, g, 2 * I);
    } else {
      kernels::linear_forward(*table_, w.gate, xe, r, M, g, 2 * I);
      kernels::linear_forward(*table_, w.up, xe, r, M, g + I, 2 * I);
    }
    parallel_rows(r, 16, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i)
        table_->silu_mul_f32(g + i * 2 * I, g + i * 2 * I + I, act + (r0 + i) * I, I);
    });
    kernels::linear_forward(*table_, w.down, act + r0 * I, r, I, y + r0 * M, M);
  }
}

}  // namespace xmoe::moe
