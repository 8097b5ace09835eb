#include "moe/packed_experts.hpp"

#include "kernels/linear.hpp"
#include "moe/parallel.hpp"
#include "xmoe/error.hpp"

namespace xmoe::moe {

namespace {

bool has_shape(const kernels::PackedWeight& w, int64_t rows, int64_t cols) {
  return w.rows == rows && w.cols == cols;
}

}  // namespace

PackedSwigluExperts::PackedSwigluExperts(std::vector<SwigluWeights> experts,
                                         const kernels::KernelTable& table,
                                         const ExpertDescriptor& descriptor)
    : table_(&table), descriptor_(descriptor), experts_(std::move(experts)) {
  XMOE_CHECK(!experts_.empty(), "packed experts: no experts");
  const bool interleaved = descriptor_.gate_up_layout == GateUpLayout::interleaved;
  model_dim_ = experts_[0].down.rows;
  hidden_ = experts_[0].down.cols;
  for (size_t e = 0; e < experts_.size(); ++e) {
    const SwigluWeights& w = experts_[e];
    const int64_t M = model_dim_, I = hidden_;
    XMOE_CHECK(has_shape(w.down, M, I), "packed experts: expert ", e, " has down [", w.down.rows, ", ",
               w.down.cols, "], expected [", M, ", ", I, "] like expert 0");
    if (interleaved) {
      XMOE_CHECK(has_shape(w.gate_up, 2 * I, M) && w.gate.rows == 0 && w.up.rows == 0,
                 "packed experts: expert ", e, " (", descriptor_.describe(), ") needs one gate_up [", 2 * I,
                 ", ", M, "], got gate_up [", w.gate_up.rows, ", ", w.gate_up.cols, "] and gate/up with ",
                 w.gate.rows, "/", w.up.rows, " rows");
      gate_up_.push_back(w.gate_up);
      joined_.push_back(1);
    } else {
      XMOE_CHECK(has_shape(w.gate, I, M) && has_shape(w.up, I, M) && w.gate_up.rows == 0,
                 "packed experts: expert ", e, " has gate [", w.gate.rows, ", ", w.gate.cols, "], up [",
                 w.up.rows, ", ", w.up.cols, "]; expected gate and up [", I, ", ", M, "] (down [", M, ", ", I,
                 "])");
      const kernels::PackedWeight parts[] = {w.gate, w.up};
      const auto joined = kernels::join_rows(parts);
      joined_.push_back(joined ? 1 : 0);
      gate_up_.push_back(joined ? *joined : kernels::PackedWeight{});
    }
    XMOE_CHECK(w.gate_up_bias.size() == (descriptor_.gate_up_bias ? static_cast<size_t>(2 * I) : 0) &&
                   w.down_bias.size() == (descriptor_.down_bias ? static_cast<size_t>(M) : 0),
               "packed experts: expert ", e, " has a gate_up bias of ", w.gate_up_bias.size(),
               " and a down bias of ", w.down_bias.size(), " values; ", descriptor_.describe(), " needs ",
               descriptor_.gate_up_bias ? 2 * I : 0, " and ", descriptor_.down_bias ? M : 0);
  }
}

void PackedSwigluExperts::forward_rows(const float* x, std::span<const ExpertRange> ranges, int64_t R,
                                       float* y) {
  const int64_t M = model_dim_, I = hidden_;
  // plain SwiGLU over gate-then-up rows keeps the kernel table's vector silu_mul (Qwen3's bits)
  const bool table_silu = descriptor_.activation == GatedActivation::swiglu &&
                          descriptor_.gate_up_layout == GateUpLayout::separate;
  // Gate and up outputs side by side, in the weight's row order (separate: gate [0, I) then up [I, 2I)).
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
      for (int64_t i = i0; i < i1; ++i) {
        float* row = g + i * 2 * I;
        if (!w.gate_up_bias.empty())
          for (int64_t j = 0; j < 2 * I; ++j) row[j] += w.gate_up_bias[static_cast<size_t>(j)];
        if (table_silu)
          table_->silu_mul_f32(row, row + I, act + (r0 + i) * I, I);
        else
          gated_activation_row(descriptor_, row, act + (r0 + i) * I, I);
      }
    });
    float* ye = y + r0 * M;
    kernels::linear_forward(*table_, w.down, act + r0 * I, r, I, ye, M);
    if (!w.down_bias.empty())
      parallel_rows(r, 16, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i)
          for (int64_t j = 0; j < M; ++j) ye[i * M + j] += w.down_bias[static_cast<size_t>(j)];
      });
  }
}

}  // namespace xmoe::moe
