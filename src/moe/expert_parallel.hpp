// Expert parallelism: the dispatched [E, C, M] buffer goes to the ranks that own the experts by all-to-all,
// the local experts run on [L, W·C, M] (rows ordered by source rank, as in Tutel), and the outputs come back
// the same way. adaptive_r = 0 instead gathers every expert's parameters and runs all E experts locally (data
// parallel), reduce-scattering their gradients back into the owners' shards. Parameters never move between
// layouts, so r and the overlap degree can change on every call.
#pragma once
#include <memory>
#include <vector>

#include "moe/compute.hpp"
#include "moe/experts.hpp"
#include "util/buffer.hpp"
#include "xmoe/communicator.hpp"

namespace xmoe::moe {

template <class S>
class ExpertParallelStage {
 public:
  using Acc = acc_t<S>;
  // local: the L = E / W experts this rank owns (their parameters are the layer's); config describes the
  // whole layer. Builds a private whole-model expert set for adaptive_r = 0.
  ExpertParallelStage(const MoeConfig& config, Communicator& group, Experts<S>& local,
                      std::vector<Parameter*> local_params);

  // disp: [E, C, M] in this rank's token order; writes yd [E, C, O]. r ∈ {0, 1}; overlap ≥ 1 divides C.
  void forward(const Ops<S>& ops, const S* disp, int64_t capacity, int r, int overlap, S* yd);
  // disp: the forward's input (unchanged since); dyd: [E, C, O] → dxd [E, C, M]; accumulates the local
  // experts' parameter gradients.
  void backward(const Ops<S>& ops, const S* disp, const S* dyd, Acc* dxd);
  size_t workspace_bytes() const;
  double communication_seconds() const { return comm_seconds_; }  // since the last forward began

 private:
  void forward_overlapped(const Ops<S>& ops, const S* disp, int overlap, S* yd);
  void all_to_all(const void* send, void* recv, size_t count, ElementType type);  // flat or 2DH, timed

  Communicator& group_;
  Experts<S>& local_;
  std::vector<Parameter*> local_params_;
  std::vector<std::unique_ptr<Parameter>> full_params_;
  std::unique_ptr<Experts<S>> full_;
  int W_, L_, E_;
  int64_t M_, O_, C_ = 0;
  int r_ = 1;
  Buffer<S> recv_, x_local_, y_local_, send_back_, chunk_send_, chunk_recv_, chunk_back_, chunk_back_recv_;
  Buffer<S> dy_recv_, dy_local_;
  Buffer<Acc> dx_local_, dx_send_, grad_scratch_;
  std::vector<ExpertRange> ranges_;
  std::unique_ptr<HierarchicalAllToAll> two_dim_;
  double comm_seconds_ = 0;
};

}  // namespace xmoe::moe
