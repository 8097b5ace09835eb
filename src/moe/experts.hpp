// Batched experts over rows grouped by expert: rows [offsets[e], offsets[e+1]) of x go to local expert e.
// The same code serves Tutel's padded [E, C, M] buffer (offsets = e·C) and the grouped dropless layout.
#pragma once
#include <memory>
#include <span>
#include <vector>

#include "moe/compute.hpp"
#include "xmoe/moe_layer.hpp"

namespace xmoe::moe {

// Rows [begin, end) of the buffer go to local expert `expert`.
struct ExpertRange {
  int64_t expert = 0, begin = 0, end = 0;
};

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
    ranges_.clear();
    for (size_t e = 0; e + 1 < offsets.size(); ++e)
      ranges_.push_back({static_cast<int64_t>(e), offsets[e], offsets[e + 1]});
    forward_rows(ops, x, ranges_, offsets.back(), y);
  }
  // x is the forward's input (unchanged since); dy [R, O] → dx [R, M]; accumulates parameter gradients.
  virtual void backward(const Ops<S>& ops, const S* x, const S* dy, std::span<const int64_t> offsets,
                        Acc* dx) = 0;
  virtual size_t workspace_bytes() const = 0;

 private:
  std::vector<ExpertRange> ranges_;
};

// Which experts (and which hidden slice) an Experts object holds: experts [first, first + count) of the
// global E, each with hidden rows [hidden_begin, hidden_begin + hidden_size) of the full expert.
struct ExpertShard {
  int first = 0, count = 0;
  int64_t hidden_begin = 0, hidden_size = 0;
};
ExpertShard whole_model_shard(const MoeConfig& config);

// Creates the experts named by config.experts.type holding `shard`; appends their parameters. Initial values
// are the whole model's (config.seed_experts) at the shard's positions, so a sharded layer starts from
// exactly the single-process weights.
template <class S>
std::unique_ptr<Experts<S>> make_experts(const MoeConfig& config, const ExpertShard& shard,
                                         std::vector<std::unique_ptr<Parameter>>& params);

kernels::Activation parse_activation(const std::string& name);  // throws naming experts.activation

}  // namespace xmoe::moe
