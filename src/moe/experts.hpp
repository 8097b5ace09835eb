// Batched experts over rows grouped by expert: rows [offsets[e], offsets[e+1]) of x go to local expert e.
// The same code serves Tutel's padded [E, C, M] buffer (offsets = e·C) and the grouped dropless layout.
#pragma once
#include <memory>
#include <span>
#include <vector>

#include "moe/compute.hpp"
#include "xmoe/error.hpp"
#include "xmoe/moe_layer.hpp"

namespace xmoe::moe {

// Rows [begin, end) of the buffer go to local expert `expert`.
struct ExpertRange {
  int64_t expert = 0, begin = 0, end = 0;
};

// The parameter gradients' segments: expert e's rows [offsets[e], offsets[e + 1]) cut at every row of `cuts`
// (sorted) strictly inside them, fn(e, r0, r1) for each non-empty piece in buffer order. A segment is one
// source's rows (one rank's tokens in an expert-parallel run) and its weight gradients are one GEMM each,
// accumulated in order: so an expert-parallel run sums exactly as the single-process layer does over each
// rank's tokens in turn, whatever arithmetic the GEMM uses (AMX tiles group k in steps of 32, so a row's bits
// depend on its offset within the product).
template <class Fn>
void for_each_segment(std::span<const int64_t> offsets, std::span<const int64_t> cuts, Fn&& fn) {
  size_t c = 0;
  for (size_t e = 0; e + 1 < offsets.size(); ++e) {
    for (int64_t r0 = offsets[e], r1 = offsets[e + 1]; r0 < r1;) {
      while (c < cuts.size() && cuts[c] <= r0) ++c;
      const int64_t end = c < cuts.size() && cuts[c] < r1 ? cuts[c] : r1;
      fn(static_cast<int64_t>(e), r0, end);
      r0 = end;
    }
  }
}

template <class S>
class Experts {
 public:
  using Acc = acc_t<S>;
  virtual ~Experts() = default;
  virtual int64_t output_dim() const = 0;
  // Runs the given row ranges of a buffer of total_rows rows (ranges may come in several calls between two
  // backwards, e.g. one per overlap chunk; each row's result does not depend on how rows are grouped). What
  // backward needs is kept per row, so backward sees every row of the buffer at once.
  virtual void forward_rows(const Ops<S>& ops, const S* x, std::span<const ExpertRange> ranges,
                            int64_t total_rows, S* y) = 0;
  // Whether forward_rows accepts arbitrary ranges (a user's CustomExpert takes one range per expert only).
  virtual bool supports_row_ranges() const { return true; }
  void forward(const Ops<S>& ops, const S* x, std::span<const int64_t> offsets, S* y) {
    forward_rows(ops, x, ranges_of(offsets), offsets.back(), y);
  }
  // x is the forward's input (unchanged since); dy [R, O] → dx [R, M]; accumulates parameter gradients, one
  // product per segment (for_each_segment: an expert's rows cut where `cuts` says another source's rows
  // begin; empty: one source). Experts with a split backward run it as its two parts.
  virtual void backward(const Ops<S>& ops, const S* x, const S* dy, std::span<const int64_t> offsets,
                        std::span<const int64_t> cuts, Acc* dx) {
    backward_rows(ops, x, dy, ranges_of(offsets), offsets.back(), dx);
    backward_params(ops, x, dy, offsets, cuts);
  }
  // Backward in two parts, for overlapped chunks: backward_rows writes dx for the given row ranges (a row's
  // dx depends on that row alone) and may come in several calls with the same total_rows; backward_params
  // then accumulates the parameter gradients over every row, in buffer order, one product per segment, so
  // that the sum order (and every bit) is that of backward(). Only where supports_split_backward().
  virtual bool supports_split_backward() const { return false; }
  virtual void backward_rows(const Ops<S>&, const S*, const S*, std::span<const ExpertRange>, int64_t, Acc*) {
    throw Error("experts: these experts have no split backward");
  }
  virtual void backward_params(const Ops<S>&, const S*, const S*, std::span<const int64_t>,
                               std::span<const int64_t>) {
    throw Error("experts: these experts have no split backward");
  }
  virtual size_t workspace_bytes() const = 0;

 private:
  // Expert e's rows [offsets[e], offsets[e + 1]) as ranges.
  std::span<const ExpertRange> ranges_of(std::span<const int64_t> offsets) {
    ranges_.clear();
    for (size_t e = 0; e + 1 < offsets.size(); ++e)
      ranges_.push_back({static_cast<int64_t>(e), offsets[e], offsets[e + 1]});
    return ranges_;
  }

  std::vector<ExpertRange> ranges_;
};

// Which experts (and which hidden slice) an Experts object holds: experts [first, first + count) of the
// global E, each with hidden rows [hidden_begin, hidden_begin + hidden_size) of the full expert.
// A hidden-sharded expert (E < W) also holds only columns [output_begin, output_begin + output_size) of the
// fc2 bias (Tutel's [L, O/sc] layout); output_size 0 means all O. Such an object is a parameter holder: it
// cannot run forward, since its bias is partial (the expert-parallel stage gathers what a call needs).
struct ExpertShard {
  int first = 0, count = 0;
  int64_t hidden_begin = 0, hidden_size = 0;
  int64_t output_begin = 0, output_size = 0;
  // Eval-only holders (an LLM's MoE blocks, whose weights are loaded from a checkpoint): parameters start
  // zero, without random initialisation or gradient tensors (at real model sizes both cost gigabytes).
  bool inference_only = false;
};
ExpertShard whole_model_shard(const MoeConfig& config);

// The dim of a built-in expert parameter ([count, ...]) that a hidden-sharded layout splits: the hidden dim
// (1 for fc1/fc2 weights, fc1 bias, gate/up projections; 2 for down_proj [E, M, H]), or the output dim for
// the fc2 bias. Throws naming the parameter when it is not a built-in expert parameter.
int expert_split_dim(const std::string& param_name);

// Creates the experts named by config.experts.type holding `shard`; appends their parameters. Initial values
// are the whole model's (config.seed_experts) at the shard's positions, so a sharded layer starts from
// exactly the single-process weights.
template <class S>
std::unique_ptr<Experts<S>> make_experts(const MoeConfig& config, const ExpertShard& shard,
                                         std::vector<std::unique_ptr<Parameter>>& params);

kernels::Activation parse_activation(const std::string& name);  // throws naming experts.activation

}  // namespace xmoe::moe
