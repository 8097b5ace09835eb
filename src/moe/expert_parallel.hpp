// Expert parallelism: the dispatched [E, C, M] buffer goes to the ranks that own the experts by all-to-all,
// the local experts run on [L, W·C, M] (rows ordered by source rank, as in Tutel), and the outputs come back
// the same way. adaptive_r = 0 instead gathers every expert's parameters and runs all E experts locally (data
// parallel), reduce-scattering their gradients back into the owners' shards.
//
// With fewer experts than ranks (W % E == 0) each expert's hidden dimension is split over sc = W / E ranks
// (rank w holds hidden slice w % sc of expert w / sc, and slice w % sc of its fc2 bias's output columns, as
// Tutel lays them out). adaptive_r ∈ {0} ∪ divisors(sc), as in Tutel: with b = sc / r, each block of b
// consecutive ranks of an expert gathers its hidden slices (hidden H / r), every expert's capacity slots are
// sent r times, each rank of a block taking C / b of them, and the r partial outputs (one per hidden part)
// are summed at the source. The fc2 bias is added by hidden part 0 only, so the sum counts it exactly once
// (Tutel scales it by 1 / r instead, which is inexact when r is not a power of two). SwiGLU splits gate_proj
// and up_proj by the same hidden rows and down_proj by the same hidden columns, so every r is correct.
//
// a2a_overlap_degree D splits each rank's slots into D chunks whose all-to-alls overlap the experts' work,
// in forward and in backward (dx rows per chunk; parameter gradients over all rows at the end, in the
// unchunked order), so results are bit-identical to D = 1, for every layout and r > 0.
//
// Parameters never move between layouts, so r and the overlap degree can change on every call.
#pragma once
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "moe/compute.hpp"
#include "moe/experts.hpp"
#include "util/buffer.hpp"
#include "xmoe/communicator.hpp"

namespace xmoe::moe {

// How E experts sit on W ranks: L local experts per rank (E % W == 0, sc = 1) or one expert split over
// sc = W / E ranks (W % E == 0). Throws naming experts.num_experts for any other E, and naming
// experts.hidden_size / experts.output_dim when the split does not divide them.
struct ExpertPlacement {
  int local_experts = 1, shards_per_expert = 1;
  ExpertShard shard;  // what this rank holds
};
ExpertPlacement place_experts(const MoeConfig& config, int rank, int world);

template <class S>
class ExpertParallelStage {
 public:
  using Acc = acc_t<S>;
  // local: the experts (or the hidden slice of one expert) this rank holds (their parameters are the
  // layer's); config describes the whole layer. Collective over group (it may split sub-groups).
  ExpertParallelStage(const MoeConfig& config, Communicator& group, Experts<S>& local,
                      std::vector<Parameter*> local_params, const ExpertPlacement& placement);

  int shards_per_expert() const { return sc_; }
  // Throws naming adaptive_r unless r ∈ {0} ∪ divisors(sc).
  void check_r(int r) const;

  // disp: [E, C, M] in this rank's token order; writes yd [E, C, O]. r valid (check_r); overlap ≥ 1; C is a
  // multiple of sc (and of sc·overlap for overlapped chunks).
  void forward(const Ops<S>& ops, const S* disp, int64_t capacity, int r, int overlap, S* yd);
  // Grouped (dropless) execution: disp holds each expert's kept rows back to back, expert e's at
  // [offsets[e], offsets[e + 1]) (no padding). The per-expert counts go first (all-to-all), then exactly the
  // rows (all-to-all-v); the local experts run on their rows grouped by expert and ordered by source rank, as
  // in the padded layout. Writes yd in disp's layout. Needs unsharded experts (sc = 1); any overlap degree
  // computes the same, so it runs without chunks.
  void forward_grouped(const Ops<S>& ops, const S* disp, std::span<const int64_t> offsets, int r, S* yd);
  // disp: the forward's input (unchanged since); dyd: [E, C, O] (or the grouped layout) → dxd [E, C, M];
  // accumulates the local experts' parameter gradients.
  void backward(const Ops<S>& ops, const S* disp, const S* dyd, Acc* dxd);
  size_t workspace_bytes() const;
  double communication_seconds() const { return comm_seconds_; }  // since the last forward began

 private:
  // The experts one r > 0 of a sharded layout runs: hidden part q = (rank % sc) / b of this rank's expert.
  struct ShardedWork {
    std::unique_ptr<Communicator> block;  // the b ranks whose hidden slices make part q; null when b == 1
    std::vector<std::unique_ptr<Parameter>> params;  // same order as the local parameters
    std::unique_ptr<Experts<S>> experts;
  };

  void forward_sharded(const Ops<S>& ops, const S* disp, int r, int overlap, S* yd);
  void backward_sharded(const Ops<S>& ops, const S* dyd, Acc* dxd);
  void backward_grouped(const Ops<S>& ops, const S* disp, const S* dyd, Acc* dxd);
  // Rows received as [source][local expert] ↔ the experts' order [local expert][source].
  template <class T>
  void regroup(const T* src, T* dst, int64_t width, bool to_experts) const;
  // The grouped all-to-all-v of rows of `width` elements: out (to the experts' owners) or back.
  void exchange_rows(const void* send, void* recv, int64_t width, ElementType type, bool out);
  void gather_all_experts();
  void reduce_scatter_all_experts();
  ShardedWork& sharded_work(int r);
  void all_to_all(const void* send, void* recv, size_t count, ElementType type);  // flat or 2DH, timed
  template <class Fn>
  void timed(Fn&& fn);
  // Overlapped chunks (overlap_ > 1) of whole experts (b = 0) or of a sharded layout's part (b ≥ 1).
  void forward_in_chunks(const Ops<S>& ops, const S* disp, Experts<S>& ex, int b, S* yd);
  void backward_in_chunks(const Ops<S>& ops, const S* dyd, Experts<S>& ex, int b, Acc* dxd);
  template <class Out, class RunRows, class AfterRows>
  void exchange_in_chunks(int b, const S* src, int64_t in_w, S* local_in, Out* local_out, int64_t out_w,
                          Buffer<Out>& back_buffer, Buffer<Out>& back_recv_buffer, Out* dst,
                          RunRows&& run_rows, AfterRows&& after_rows);

  MoeConfig config_;
  Communicator& group_;
  Experts<S>& local_;
  std::vector<Parameter*> local_params_;
  std::vector<std::unique_ptr<Parameter>> full_params_;
  std::unique_ptr<Experts<S>> full_;
  int W_, L_, E_, sc_;
  int64_t M_, O_, C_ = 0;
  int r_ = 1;
  int overlap_ = 1;                            // the chunks the last forward ran in (1: none)
  std::unique_ptr<Communicator> shard_group_;  // the sc ranks holding slices of this rank's expert (sc > 1)
  std::map<int, ShardedWork> work_;            // by r, built on first use
  Buffer<S> recv_, x_local_, y_local_, send_back_, chunk_send_, chunk_recv_, chunk_back_, chunk_back_recv_;
  Buffer<S> dy_recv_, dy_local_, pieces_;
  Buffer<Acc> dx_local_, dx_send_, grad_scratch_, grad_pieces_, dx_chunk_send_, dx_chunk_recv_;
  std::vector<ExpertRange> ranges_;
  // Grouped execution (state of the last forward): rows per (destination, local expert) sent and per
  // (source, local expert) received, and the local experts' row offsets.
  bool grouped_ = false;
  std::vector<int64_t> grouped_offsets_, sent_counts_, recv_counts_, local_offsets_;
  std::unique_ptr<HierarchicalAllToAll> two_dim_;
  double comm_seconds_ = 0;
};

}  // namespace xmoe::moe
