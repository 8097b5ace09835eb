#include "moe/packed_experts.hpp"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <thread>

#include "kernels/linear.hpp"
#include "util/buffer.hpp"
#include "xmoe/error.hpp"

namespace xmoe::moe {

namespace {

bool has_shape(const kernels::PackedWeight& w, int64_t rows, int64_t cols) {
  return w.rows == rows && w.cols == cols;
}

// Rows per activation work item.
constexpr int64_t kActivationRows = 16;

// A format the table has no kernel for is named when the experts are built, not at their first batch.
void check_kernel(const kernels::KernelTable& table, const kernels::PackedWeight& w, size_t expert,
                  const char* what) {
  XMOE_CHECK(w.rows == 0 || table.linear[static_cast<size_t>(w.format)] != nullptr, "packed experts: expert ",
             expert, " ", what, ": no ", kernels::isa_name(table.isa), " kernel for weights in format ",
             kernels::weight_format_name(w.format));
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
    check_kernel(table, w.gate, e, "gate");
    check_kernel(table, w.up, e, "up");
    check_kernel(table, w.gate_up, e, "gate_up");
    check_kernel(table, w.down, e, "down");
  }
}

void PackedSwigluExperts::forward_rows(const float* x, std::span<const ExpertRange> ranges, int64_t R,
                                       float* y) {
  forward_rows(x, ranges, R, y, own_);
}

void PackedSwigluExperts::forward_rows(const float* x, std::span<const ExpertRange> ranges, int64_t R,
                                       float* y, ExpertScratch& scratch) {
  const int64_t M = model_dim_, I = hidden_;
  int64_t routed_rows = 0;
  for (const ExpertRange& rg : ranges) {
    XMOE_CHECK(
        rg.expert >= 0 && rg.expert < num_experts() && rg.begin >= 0 && rg.end >= rg.begin && rg.end <= R,
        "packed experts: bad row range [", rg.begin, ", ", rg.end, ") of expert ", rg.expert, " (",
        num_experts(), " experts, ", R, " rows)");
    routed_rows += rg.end - rg.begin;
  }
  if (routed_rows == 0) return;
  // plain SwiGLU over gate-then-up rows keeps the kernel table's vector silu_mul (Qwen3's bits)
  const bool table_silu = descriptor_.activation == GatedActivation::swiglu &&
                          descriptor_.gate_up_layout == GateUpLayout::separate;
  // Gate and up outputs side by side, in the weight's row order (separate: gate [0, I) then up [I, 2I)).
  float* gu = scratch.gate_up.ensure(static_cast<size_t>(R * 2 * I));
  float* act = scratch.act.ensure(static_cast<size_t>(R * I));

  // One parallel schedule for the whole layer: (expert, column tile) items of gate_up, the activation by
  // row chunks, then (expert, column tile) items of down. The same items run for any team, each output
  // computed by the one item that owns it, so the team size changes no bit.
  const double macs = static_cast<double>(routed_rows) * static_cast<double>(3 * I * M);
  const int threads = kernels::threads_for_macs(macs);
  plan_expert_tiles(ranges, 2 * I, threads, gate_up_tiles_);
  plan_expert_tiles(ranges, M, threads, down_tiles_);
  row_chunks_.clear();
  for (const ExpertRange& rg : ranges)
    for (int64_t r0 = rg.begin; r0 < rg.end; r0 += kActivationRows)
      row_chunks_.push_back({rg.expert, r0, std::min(rg.end, r0 + kActivationRows)});

  const auto gate_up_tile = [&](const ExpertTile& t) {
    const ExpertRange& rg = ranges[static_cast<size_t>(t.range)];
    const auto e = static_cast<size_t>(rg.expert);
    const int64_t r = rg.end - rg.begin;
    const float* xe = x + rg.begin * M;
    float* g = gu + rg.begin * 2 * I;
    if (joined_[e]) {
      kernels::linear_forward_columns(*table_, gate_up_[e], xe, r, M, t.n0, t.n1, g, 2 * I);
      return;
    }
    // Columns [0, I) are gate's rows, [I, 2I) up's.
    const SwigluWeights& w = experts_[e];
    if (t.n0 < I)
      kernels::linear_forward_columns(*table_, w.gate, xe, r, M, t.n0, std::min(t.n1, I), g, 2 * I);
    if (t.n1 > I)
      kernels::linear_forward_columns(*table_, w.up, xe, r, M, std::max(t.n0, I) - I, t.n1 - I, g + I, 2 * I);
  };
  // Rows [begin, end) of expert e's gate/up outputs into out (I values a row); `row` is scratch for a row
  // with its bias added, so gu itself is only read.
  const auto activate = [&](int32_t expert, int64_t begin, int64_t end, float* out, float* row) {
    const SwigluWeights& w = experts_[static_cast<size_t>(expert)];
    for (int64_t i = begin; i < end; ++i) {
      const float* in = gu + i * 2 * I;
      if (!w.gate_up_bias.empty()) {
        for (int64_t j = 0; j < 2 * I; ++j) row[j] = in[j] + w.gate_up_bias[static_cast<size_t>(j)];
        in = row;
      }
      float* o = out + (i - begin) * I;
      if (table_silu)
        table_->silu_mul_f32(in, in + I, o, I);
      else
        gated_activation_row(descriptor_, in, o, I);
    }
  };
  // Each down tile activates its own rows when every tile is wide (see kFusedActivationColumns): then the
  // schedule needs no barrier (below). Either way an activation is the same function of the same gate/up
  // values, so the bits do not change.
  bool fused = true;
  for (const ExpertTile& t : down_tiles_) fused = fused && t.n1 - t.n0 >= kFusedActivationColumns;
  int64_t most_rows = 0;
  for (const ExpertRange& rg : ranges) most_rows = std::max(most_rows, rg.end - rg.begin);
  const auto down_tile = [&](const ExpertTile& t, Buffer<float>& local) {
    const ExpertRange& rg = ranges[static_cast<size_t>(t.range)];
    const SwigluWeights& w = experts_[static_cast<size_t>(rg.expert)];
    const int64_t r = rg.end - rg.begin;
    float* ye = y + rg.begin * M;
    const float* a = act + rg.begin * I;
    if (fused) {
      float* own = local.ensure(static_cast<size_t>((most_rows + 2) * I));
      activate(rg.expert, rg.begin, rg.end, own, own + most_rows * I);
      a = own;
    }
    kernels::linear_forward_columns(*table_, w.down, a, r, I, t.n0, t.n1, ye, M);
    if (!w.down_bias.empty())
      for (int64_t i = 0; i < r; ++i)
        for (int64_t j = t.n0; j < t.n1; ++j) ye[i * M + j] += w.down_bias[static_cast<size_t>(j)];
  };

  // An exception cannot leave a parallel region: the first one is kept and rethrown after it.
  std::exception_ptr failure;
  const auto guarded = [&](const auto& run) {
    try {
      run();
    } catch (...) {
#pragma omp critical(packed_experts_failure)
      if (!failure) failure = std::current_exception();
    }
  };
  const auto gate_up_count = static_cast<int64_t>(gate_up_tiles_.size());
  const auto chunk_count = fused ? 0 : static_cast<int64_t>(row_chunks_.size());
  const auto down_count = static_cast<int64_t>(down_tiles_.size());
  if (fused) {
    // No barrier at all: one queue of every gate_up tile, then every down tile, both in range order, handed
    // out by one counter. A down tile waits only for its own expert's gate_up tiles (counted down in
    // `pending`), which by then were all handed out to threads that wait on nothing, so the wait ends; the
    // first down tiles are the experts finished first, and the tail of gate_up overlaps the start of down
    // instead of idling at a barrier.
    std::vector<std::atomic<int32_t>> pending(ranges.size());
    for (const ExpertTile& t : gate_up_tiles_)
      pending[static_cast<size_t>(t.range)].fetch_add(1, std::memory_order_relaxed);
    std::atomic<int64_t> next{0};
    const int64_t items = gate_up_count + down_count;
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
      Buffer<float> local;  // a down tile's activations and a biased gate/up row
      for (int64_t i = next.fetch_add(1, std::memory_order_relaxed); i < items;
           i = next.fetch_add(1, std::memory_order_relaxed)) {
        if (i < gate_up_count) {
          const ExpertTile& t = gate_up_tiles_[static_cast<size_t>(i)];
          guarded([&] { gate_up_tile(t); });
          pending[static_cast<size_t>(t.range)].fetch_sub(1, std::memory_order_release);
        } else {
          const ExpertTile& t = down_tiles_[static_cast<size_t>(i - gate_up_count)];
          while (pending[static_cast<size_t>(t.range)].load(std::memory_order_acquire) > 0)
            std::this_thread::yield();
          guarded([&] { down_tile(t, local); });
        }
      }
    }
  } else {
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
      Buffer<float> local;  // a biased gate/up row
#pragma omp for schedule(dynamic, 1)
      for (int64_t i = 0; i < gate_up_count; ++i)
        guarded([&] { gate_up_tile(gate_up_tiles_[static_cast<size_t>(i)]); });
#pragma omp for schedule(dynamic, 1)
      for (int64_t i = 0; i < chunk_count; ++i) {
        const ExpertRange& c = row_chunks_[static_cast<size_t>(i)];
        activate(c.expert, c.begin, c.end, act + c.begin * I, local.ensure(static_cast<size_t>(2 * I)));
      }
#pragma omp for schedule(dynamic, 1)
      for (int64_t i = 0; i < down_count; ++i)
        guarded([&] { down_tile(down_tiles_[static_cast<size_t>(i)], local); });
    }
  }
  if (failure) std::rethrow_exception(failure);
}

}  // namespace xmoe::moe
