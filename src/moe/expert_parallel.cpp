#include "moe/expert_parallel.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "moe/parallel.hpp"
#include "xmoe/error.hpp"

namespace xmoe::moe {

namespace {

template <class T>
constexpr ElementType element_type_of() {
  if constexpr (std::is_same_v<T, float>) return ElementType::f32;
  if constexpr (std::is_same_v<T, double>) return ElementType::f64;
  if constexpr (std::is_same_v<T, bf16>) return ElementType::bf16;
}

// dst[b][a] = src[a][b] for blocks of `block` elements: [A][B] → [B][A].
template <class T>
void transpose_blocks(const T* src, T* dst, int64_t A, int64_t B, int64_t block) {
  parallel_rows(A * B, 4, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t a = i / B, b = i % B;
      std::memcpy(static_cast<void*>(dst + (b * A + a) * block), src + i * block,
                  sizeof(T) * static_cast<size_t>(block));
    }
  });
}

}  // namespace

ExpertPlacement place_experts(const MoeConfig& c, int rank, int W) {
  const int E = c.experts.num_experts;
  const int64_t H = c.experts.hidden_size;
  ExpertPlacement p;
  if (E % W == 0) {
    p.local_experts = E / W;
    p.shard = ExpertShard{rank * p.local_experts, p.local_experts, 0, H, 0, 0};
    return p;
  }
  XMOE_CHECK(
      W % E == 0, "experts.num_experts: ", E, " experts over ", W,
      " ranks: expert parallelism needs num_experts to be a multiple of the group size or to divide it");
  XMOE_CHECK(c.experts.type != "custom", "experts.num_experts: ", E, " experts over ", W,
             " ranks would split each expert's hidden dimension, which custom experts do not support; use a "
             "multiple of the group size");
  const int sc = W / E, j = rank % sc;
  XMOE_CHECK(H % sc == 0, "experts.hidden_size: ", H, " does not split over the ", sc,
             " ranks that share each expert (", W, " ranks, ", E, " experts)");
  const int64_t O = c.experts.output_dim > 0 ? c.experts.output_dim : c.model_dim;
  const bool split_bias = c.experts.type == "ffn" && c.experts.has_fc2_bias;
  if (split_bias)
    XMOE_CHECK(O % sc == 0, "experts.output_dim: ", O, " (the fc2 bias) does not split over the ", sc,
               " ranks that share each expert (", W, " ranks, ", E, " experts)");
  p.local_experts = 1;
  p.shards_per_expert = sc;
  p.shard =
      ExpertShard{rank / sc, 1, j * (H / sc), H / sc, split_bias ? j * (O / sc) : 0, split_bias ? O / sc : 0};
  return p;
}

namespace {

// Moves between P = groups·per pieces shaped like `local` ([L, ...]) and the tensor they make: piece p holds
// slice p % per, along dim `dim`, of experts [(p / per)·L, (p / per + 1)·L). The whole tensor is
// [groups·L, ...] with dim `dim` per times longer. to_whole: pieces → whole, else whole → pieces.
template <class T>
void move_pieces(T* pieces, T* whole, const Shape& local, int dim, int64_t groups, int64_t per,
                 bool to_whole) {
  const int64_t L = local[0], n = local[dim];
  int64_t outer = 1, inner = 1;
  for (int i = 1; i < dim; ++i) outer *= local[i];
  for (int i = dim + 1; i < local.ndim(); ++i) inner *= local[i];
  const int64_t run = n * inner, piece = L * outer * run, runs = groups * per * L * outer;
  parallel_rows(runs, 64, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t p = i / (L * outer), lo = i % (L * outer), g = p / per, sl = p % per;
      T* pc = pieces + p * piece + lo * run;
      T* wh = whole + ((g * L * outer + lo) * per + sl) * run;
      if (to_whole)
        std::memcpy(static_cast<void*>(wh), pc, sizeof(T) * static_cast<size_t>(run));
      else
        std::memcpy(static_cast<void*>(pc), wh, sizeof(T) * static_cast<size_t>(run));
    }
  });
}

// Row cuts every `len` rows of an R-row buffer: each source rank's rows, where every rank sends `len` rows
// per expert (for_each_segment).
std::vector<int64_t> cuts_every(int64_t len, int64_t R) {
  std::vector<int64_t> cuts;
  for (int64_t r = len; len > 0 && r < R; r += len) cuts.push_back(r);
  return cuts;
}

template <class T>
void add_into(T* dst, const T* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

}  // namespace

template <class S>
ExpertParallelStage<S>::ExpertParallelStage(const MoeConfig& c, Communicator& group, Experts<S>& local,
                                            std::vector<Parameter*> local_params,
                                            const ExpertPlacement& place)
    : config_(c),
      group_(group),
      local_(local),
      local_params_(std::move(local_params)),
      W_(group.size()),
      L_(place.local_experts),
      E_(c.experts.num_experts),
      sc_(place.shards_per_expert),
      M_(c.model_dim),
      O_(local.output_dim()) {
  if (c.experts.type != "custom") full_ = make_experts<S>(c, whole_model_shard(c), full_params_);
  if (sc_ > 1) shard_group_ = group.split(group.rank() / sc_, group.rank());
  if (c.use_2dh) two_dim_ = std::make_unique<HierarchicalAllToAll>(group, c.local_size);
}

template <class S>
void ExpertParallelStage<S>::check_r(int r) const {
  std::string valid = "0";
  for (int d = 1; d <= sc_; ++d)
    if (sc_ % d == 0) valid += ", " + std::to_string(d);
  XMOE_CHECK(r >= 0 && r <= sc_ && (r == 0 || sc_ % r == 0), "adaptive_r: must be one of {", valid,
             "} (0 = data parallel, 1 = expert parallel",
             sc_ > 1 ? ", " + std::to_string(sc_) + " = expert + model parallel" : std::string(), "; ", E_,
             " experts over ", W_, " ranks), got ", r);
}

template <class S>
template <class Fn>
void ExpertParallelStage<S>::timed(Fn&& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  comm_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

template <class S>
void ExpertParallelStage<S>::all_to_all(const void* send, void* recv, size_t count, ElementType type) {
  const auto t0 = std::chrono::steady_clock::now();
  if (two_dim_)
    two_dim_->run(send, recv, count, type);
  else
    group_.all_to_all(send, recv, count, type);
  comm_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

template <class S>
void ExpertParallelStage<S>::forward(const Ops<S>& ops, const S* disp, int64_t C, int r, int overlap, S* yd) {
  check_r(r);
  XMOE_CHECK(C % sc_ == 0, "expert parallel: capacity ", C, " is not a multiple of the ", sc_,
             " ranks per expert");
  C_ = C;
  r_ = r;
  grouped_ = false;
  overlap_ = 1;
  comm_seconds_ = 0;
  const ElementType st = element_type_of<S>();
  if (r == 0) {
    XMOE_CHECK(full_ != nullptr, "adaptive_r: 0 (data parallel) needs built-in experts");
    gather_all_experts();
    std::vector<int64_t> offsets(static_cast<size_t>(E_) + 1);
    for (int e = 0; e <= E_; ++e) offsets[static_cast<size_t>(e)] = e * C;
    full_->forward(ops, disp, offsets, yd);
    return;
  }
  if (sc_ > 1) {
    forward_sharded(ops, disp, r, overlap, yd);
    return;
  }
  if (overlap > 1 && local_.supports_row_ranges() && C % overlap == 0 && C > 0) {
    overlap_ = overlap;
    forward_in_chunks(ops, disp, local_, 0, yd);
    return;
  }
  const int64_t R = static_cast<int64_t>(E_) * C;  // == L·W·C rows on every rank
  S* recv = recv_.ensure(static_cast<size_t>(R * M_));
  all_to_all(disp, recv, static_cast<size_t>(L_ * C * M_), st);
  S* xl = x_local_.ensure(static_cast<size_t>(R * M_));
  transpose_blocks(recv, xl, W_, L_, C * M_);  // [W][L][C][M] → [L][W][C][M]
  std::vector<int64_t> offsets(static_cast<size_t>(L_) + 1);
  for (int l = 0; l <= L_; ++l) offsets[static_cast<size_t>(l)] = l * W_ * C;
  S* yl = y_local_.ensure(static_cast<size_t>(R * O_));
  local_.forward(ops, xl, offsets, yl);
  S* back = send_back_.ensure(static_cast<size_t>(R * O_));
  transpose_blocks(yl, back, L_, W_, C * O_);  // [L][W][C][O] → [W][L][C][O]
  all_to_all(back, yd, static_cast<size_t>(L_ * C * O_), st);
}

// Rows of `ex` in D = overlap_ chunks, for whole experts (b = 0: slots [d·Cd, (d+1)·Cd) of every expert) or
// sharded ones (b ≥ 1: rows [d·Cd, (d+1)·Cd) of every destination's block of Cb = C/b slots). Chunk d's
// all-to-all is in flight while chunk d−1's rows run (`run_rows()` on the rows in ranges_), and each chunk's
// results start home as soon as they exist; `after_rows()` runs while the last chunks travel. Rows land where
// the unchunked path puts them ([L][W][C] or [source][Cb]) and a sharded expert's partial outputs are summed
// in the unchunked path's part order, so results are bit-identical to D = 1.
template <class S>
template <class Out, class RunRows, class AfterRows>
void ExpertParallelStage<S>::exchange_in_chunks(int b, const S* src, int64_t in_w, S* local_in,
                                                Out* local_out, int64_t out_w, Buffer<Out>& back_buffer,
                                                Buffer<Out>& back_recv_buffer, Out* dst, RunRows&& run_rows,
                                                AfterRows&& after_rows) {
  const int D = overlap_;
  const bool sharded = b > 0;
  // Blocks per rank: L experts of C slots each, or one block of Cb slots; block (w, l) starts at row
  // local_row(w, l) of the local buffers and at slot slot_of(w, l) of src/dst.
  const int64_t L = sharded ? 1 : L_, Cb = sharded ? C_ / b : C_, Cd = Cb / D, blocks = W_ * L;
  const auto local_row = [&](int64_t w, int64_t l) { return sharded ? w * Cb : (l * W_ + w) * C_; };
  const auto slot_of = [&](int64_t w, int64_t l) {
    return sharded ? (w / sc_ * C_ + (w % sc_) % b * Cb) : ((w * L + l) * C_);
  };
  const int64_t chunk_in = blocks * Cd * in_w, chunk_out = blocks * Cd * out_w;
  S* send = chunk_send_.ensure(static_cast<size_t>(D * chunk_in));
  S* recv = chunk_recv_.ensure(static_cast<size_t>(D * chunk_in));
  Out* back = back_buffer.ensure(static_cast<size_t>(D * chunk_out));
  Out* back_recv = back_recv_buffer.ensure(static_cast<size_t>(D * chunk_out));
  // Chunk d as [W][L][Cd][width]: block (w, l) of it is slots [d·Cd, (d+1)·Cd) of block (w, l).
  const auto at = [&](int64_t d, int64_t w, int64_t l, int64_t width) {
    return (d * blocks + w * L + l) * Cd * width;
  };
  for (int64_t d = 0; d < D; ++d)
    for (int64_t w = 0; w < W_; ++w)
      for (int64_t l = 0; l < L; ++l)
        std::memcpy(static_cast<void*>(send + at(d, w, l, in_w)), src + (slot_of(w, l) + d * Cd) * in_w,
                    sizeof(S) * static_cast<size_t>(Cd * in_w));
  const auto post_in = [&](int d) {
    return group_.all_to_all_async(send + d * chunk_in, recv + d * chunk_in,
                                   static_cast<size_t>(L * Cd * in_w), element_type_of<S>());
  };
  std::vector<std::unique_ptr<CommRequest>> inbound(static_cast<size_t>(D)), outbound(static_cast<size_t>(D));
  inbound[0] = post_in(0);
  for (int d = 0; d < D; ++d) {
    timed([&] { inbound[static_cast<size_t>(d)]->wait(); });
    if (d + 1 < D) inbound[static_cast<size_t>(d) + 1] = post_in(d + 1);
    ranges_.clear();
    for (int64_t w = 0; w < W_; ++w)
      for (int64_t l = 0; l < L; ++l) {
        const int64_t row = local_row(w, l) + d * Cd;
        std::memcpy(static_cast<void*>(local_in + row * in_w), recv + at(d, w, l, in_w),
                    sizeof(S) * static_cast<size_t>(Cd * in_w));
        ranges_.push_back({l, row, row + Cd});
      }
    run_rows();
    for (int64_t w = 0; w < W_; ++w)
      for (int64_t l = 0; l < L; ++l)
        std::memcpy(static_cast<void*>(back + at(d, w, l, out_w)),
                    local_out + (local_row(w, l) + d * Cd) * out_w,
                    sizeof(Out) * static_cast<size_t>(Cd * out_w));
    outbound[static_cast<size_t>(d)] =
        group_.all_to_all_async(back + d * chunk_out, back_recv + d * chunk_out,
                                static_cast<size_t>(L * Cd * out_w), element_type_of<Out>());
  }
  after_rows();
  for (int d = 0; d < D; ++d) {
    timed([&] { outbound[static_cast<size_t>(d)]->wait(); });
    for (int64_t w = 0; w < W_; ++w)
      for (int64_t l = 0; l < L; ++l) {
        Out* to = dst + (slot_of(w, l) + d * Cd) * out_w;
        const Out* from = back_recv + at(d, w, l, out_w);
        if (!sharded || (w % sc_) / b == 0)  // whole expert, or part 0 of a sharded one
          std::memcpy(static_cast<void*>(to), from, sizeof(Out) * static_cast<size_t>(Cd * out_w));
        else
          for (int64_t i = 0; i < Cd * out_w; ++i)
            to[i] = static_cast<Out>(static_cast<Acc>(to[i]) + static_cast<Acc>(from[i]));
      }
  }
}

// The forward's experts in overlap_ chunks (b as in exchange_in_chunks); rows land in the same buffers as
// without chunks, so the backward does not depend on how the forward ran.
template <class S>
void ExpertParallelStage<S>::forward_in_chunks(const Ops<S>& ops, const S* disp, Experts<S>& ex, int b,
                                               S* yd) {
  const int64_t R = W_ * (b > 0 ? C_ / b : static_cast<int64_t>(L_) * C_);
  S* xl = x_local_.ensure(static_cast<size_t>(R * M_));
  S* yl = y_local_.ensure(static_cast<size_t>(R * O_));
  exchange_in_chunks(
      b, disp, M_, xl, yl, O_, chunk_back_, chunk_back_recv_, yd,
      [&] { ex.forward_rows(ops, xl, ranges_, R, yl); }, [] {});
}

// Backward in the forward's chunks: dx rows per chunk, then the parameter gradients, summed over all rows in
// buffer order exactly as without chunks, while the last chunks' dx travel.
template <class S>
void ExpertParallelStage<S>::backward_in_chunks(const Ops<S>& ops, const S* dyd, Experts<S>& ex, int b,
                                                Acc* dxd) {
  const int L = b > 0 ? 1 : L_;
  const int64_t rows_per_expert = W_ * (b > 0 ? C_ / b : C_), R = L * rows_per_expert;
  S* dyl = dy_local_.ensure(static_cast<size_t>(R * O_));
  Acc* dxl = dx_local_.ensure(static_cast<size_t>(R * M_));
  exchange_in_chunks(
      b, dyd, O_, dyl, dxl, M_, dx_chunk_send_, dx_chunk_recv_, dxd,
      [&] { ex.backward_rows(ops, x_local_.data(), dyl, ranges_, R, dxl); },
      [&] {
        std::vector<int64_t> offsets(static_cast<size_t>(L) + 1);
        for (int l = 0; l <= L; ++l) offsets[static_cast<size_t>(l)] = l * rows_per_expert;
        ex.backward_params(ops, x_local_.data(), dyl, offsets, cuts_every(rows_per_expert / W_, R));
      });
}

template <class S>
void ExpertParallelStage<S>::backward(const Ops<S>& ops, const S* disp, const S* dyd, Acc* dxd) {
  const int64_t C = C_, R = static_cast<int64_t>(E_) * C;
  const ElementType st = element_type_of<S>(), at = element_type_of<Acc>();
  if (grouped_) {
    backward_grouped(ops, disp, dyd, dxd);
    return;
  }
  if (r_ == 0) {
    std::vector<int64_t> offsets(static_cast<size_t>(E_) + 1);
    for (int e = 0; e <= E_; ++e) offsets[static_cast<size_t>(e)] = e * C;
    for (auto& p : full_params_) p->grad.zero();
    full_->backward(ops, disp, dyd, offsets, {}, dxd);
    reduce_scatter_all_experts();
    return;
  }
  if (sc_ > 1) {
    backward_sharded(ops, dyd, dxd);
    return;
  }
  if (overlap_ > 1 && local_.supports_split_backward()) {
    backward_in_chunks(ops, dyd, local_, 0, dxd);
    return;
  }
  S* dr = dy_recv_.ensure(static_cast<size_t>(R * O_));
  all_to_all(dyd, dr, static_cast<size_t>(L_ * C * O_), st);
  S* dyl = dy_local_.ensure(static_cast<size_t>(R * O_));
  transpose_blocks(dr, dyl, W_, L_, C * O_);
  std::vector<int64_t> offsets(static_cast<size_t>(L_) + 1);
  for (int l = 0; l <= L_; ++l) offsets[static_cast<size_t>(l)] = l * W_ * C;
  Acc* dxl = dx_local_.ensure(static_cast<size_t>(R * M_));
  local_.backward(ops, x_local_.data(), dyl, offsets, cuts_every(C, R), dxl);
  Acc* ds = dx_send_.ensure(static_cast<size_t>(R * M_));
  transpose_blocks(dxl, ds, L_, W_, C * M_);
  all_to_all(ds, dxd, static_cast<size_t>(L_ * C * M_), at);
}

// Data parallel (r = 0): every rank gathers every expert's parameters (hidden slices reassembled when
// sharded) and runs all E experts on its own tokens.
template <class S>
void ExpertParallelStage<S>::gather_all_experts() {
  const ElementType st = element_type_of<S>();
  for (size_t i = 0; i < local_params_.size(); ++i) {
    const Tensor& v = local_params_[i]->value;
    const auto n = static_cast<size_t>(v.numel());
    if (sc_ == 1) {
      timed([&] { group_.all_gather(v.raw(), full_params_[i]->value.raw(), n, st); });
      continue;
    }
    S* pieces = pieces_.ensure(n * static_cast<size_t>(W_));
    timed([&] { group_.all_gather(v.raw(), pieces, n, st); });
    move_pieces(pieces, full_params_[i]->value.template data<S>(), v.shape(),
                expert_split_dim(local_params_[i]->name), E_, sc_, true);
  }
}

// Each owner receives the sum over ranks of its slice's gradients (Tutel's zero_gather backward).
template <class S>
void ExpertParallelStage<S>::reduce_scatter_all_experts() {
  const ElementType at = element_type_of<Acc>();
  for (size_t i = 0; i < local_params_.size(); ++i) {
    Tensor& g = local_params_[i]->grad;
    const auto n = static_cast<size_t>(g.numel());
    Acc* send = full_params_[i]->grad.template data<Acc>();
    if (sc_ > 1) {
      Acc* pieces = grad_pieces_.ensure(n * static_cast<size_t>(W_));
      move_pieces(pieces, send, g.shape(), expert_split_dim(local_params_[i]->name), E_, sc_, false);
      send = pieces;
    }
    Acc* sum = grad_scratch_.ensure(n);
    timed([&] { group_.reduce_scatter(send, sum, n, at, ReduceOp::sum); });
    add_into(g.template data<Acc>(), sum, static_cast<int64_t>(n));
  }
}

template <class S>
typename ExpertParallelStage<S>::ShardedWork& ExpertParallelStage<S>::sharded_work(int r) {
  auto it = work_.find(r);
  if (it != work_.end()) return it->second;
  const int b = sc_ / r, rank = group_.rank(), q = (rank % sc_) / b;
  const int64_t H = config_.experts.hidden_size;
  ShardedWork w;
  if (b > 1) w.block = group_.split(rank / b, rank);  // collective: every rank switches to r together
  w.experts = make_experts<S>(config_, ExpertShard{rank / sc_, 1, q * (H / r), H / r, 0, 0}, w.params);
  XMOE_CHECK(w.params.size() == local_params_.size(), "expert parallel: sharded experts' parameters differ");
  return work_.emplace(r, std::move(w)).first->second;
}

// Sharded experts, r > 0: block b = sc / r gathers hidden part q; expert e's slots go to its sc ranks, rank
// j taking slots [(j % b)·C/b, (j % b + 1)·C/b) for hidden part j / b; the r partial outputs are summed in
// part order.
template <class S>
void ExpertParallelStage<S>::forward_sharded(const Ops<S>& ops, const S* disp, int r, int overlap, S* yd) {
  const ElementType st = element_type_of<S>();
  ShardedWork& work = sharded_work(r);
  const int b = sc_ / r, q = (group_.rank() % sc_) / b;
  for (size_t i = 0; i < local_params_.size(); ++i) {
    const Tensor& v = local_params_[i]->value;
    Tensor& dst = work.params[i]->value;
    const auto n = static_cast<size_t>(v.numel());
    if (local_params_[i]->name == "experts.batched_fc2_bias") {
      // Output-column slices over the shard group; only part 0 adds the bias.
      timed([&] { shard_group_->all_gather(v.raw(), dst.raw(), n, st); });
      if (q != 0) dst.zero();
    } else if (b == 1) {
      dst.copy_from(v);
    } else {
      S* pieces = pieces_.ensure(n * static_cast<size_t>(b));
      timed([&] { work.block->all_gather(v.raw(), pieces, n, st); });
      move_pieces(pieces, dst.template data<S>(), v.shape(), expert_split_dim(local_params_[i]->name), 1, b,
                  true);
    }
  }
  const int64_t C = C_, Cb = C / b, R = W_ * Cb;
  if (overlap > 1 && Cb > 0 && Cb % overlap == 0) {
    overlap_ = overlap;
    forward_in_chunks(ops, disp, *work.experts, b, yd);
    return;
  }
  S* send = recv_.ensure(static_cast<size_t>(std::max<int64_t>(1, R * M_)));
  for (int w = 0; w < W_ && Cb > 0; ++w) {
    const int64_t e = w / sc_, s = (w % sc_) % b;
    std::memcpy(static_cast<void*>(send + w * Cb * M_), disp + (e * C + s * Cb) * M_,
                sizeof(S) * static_cast<size_t>(Cb * M_));
  }
  S* xl = x_local_.ensure(static_cast<size_t>(std::max<int64_t>(1, R * M_)));
  all_to_all(send, xl, static_cast<size_t>(Cb * M_), st);
  const int64_t offsets[2] = {0, R};
  S* yl = y_local_.ensure(static_cast<size_t>(std::max<int64_t>(1, R * O_)));
  work.experts->forward(ops, xl, offsets, yl);
  S* back = send_back_.ensure(static_cast<size_t>(std::max<int64_t>(1, R * O_)));
  all_to_all(yl, back, static_cast<size_t>(Cb * O_), st);
  for (int w = 0; w < W_ && Cb > 0; ++w) {
    const int64_t e = w / sc_, part = (w % sc_) / b, s = (w % sc_) % b;
    S* dst = yd + (e * C + s * Cb) * O_;
    const S* src = back + w * Cb * O_;
    if (part == 0) {
      std::memcpy(static_cast<void*>(dst), src, sizeof(S) * static_cast<size_t>(Cb * O_));
    } else {
      for (int64_t i = 0; i < Cb * O_; ++i)
        dst[i] = static_cast<S>(static_cast<Acc>(dst[i]) + static_cast<Acc>(src[i]));
    }
  }
}

template <class S>
void ExpertParallelStage<S>::backward_sharded(const Ops<S>& ops, const S* dyd, Acc* dxd) {
  const ElementType st = element_type_of<S>(), at = element_type_of<Acc>();
  const int r = r_, b = sc_ / r, q = (group_.rank() % sc_) / b;
  ShardedWork& work = sharded_work(r);
  const int64_t C = C_, Cb = C / b, R = W_ * Cb;
  for (auto& p : work.params) p->grad.zero();
  if (overlap_ > 1 && work.experts->supports_split_backward()) {
    backward_in_chunks(ops, dyd, *work.experts, b, dxd);
  } else {
    S* send = dy_recv_.ensure(static_cast<size_t>(std::max<int64_t>(1, R * O_)));
    for (int w = 0; w < W_ && Cb > 0; ++w) {
      const int64_t e = w / sc_, s = (w % sc_) % b;
      std::memcpy(static_cast<void*>(send + w * Cb * O_), dyd + (e * C + s * Cb) * O_,
                  sizeof(S) * static_cast<size_t>(Cb * O_));
    }
    S* dyl = dy_local_.ensure(static_cast<size_t>(std::max<int64_t>(1, R * O_)));
    all_to_all(send, dyl, static_cast<size_t>(Cb * O_), st);
    const int64_t offsets[2] = {0, R};
    Acc* dxl = dx_local_.ensure(static_cast<size_t>(std::max<int64_t>(1, R * M_)));
    work.experts->backward(ops, x_local_.data(), dyl, offsets, cuts_every(Cb, R), dxl);
    Acc* back = dx_send_.ensure(static_cast<size_t>(std::max<int64_t>(1, R * M_)));
    all_to_all(dxl, back, static_cast<size_t>(Cb * M_), at);
    for (int w = 0; w < W_ && Cb > 0; ++w) {
      const int64_t e = w / sc_, part = (w % sc_) / b, s = (w % sc_) % b;
      Acc* dst = dxd + (e * C + s * Cb) * M_;
      const Acc* src = back + w * Cb * M_;
      if (part == 0)
        std::memcpy(static_cast<void*>(dst), src, sizeof(Acc) * static_cast<size_t>(Cb * M_));
      else
        add_into(dst, src, Cb * M_);
    }
  }
  // Gradients of the gathered parameters go back to the slices' owners, summed over the ranks that used them.
  for (size_t i = 0; i < local_params_.size(); ++i) {
    Tensor& g = local_params_[i]->grad;
    Tensor& wg = work.params[i]->grad;
    const auto n = static_cast<size_t>(g.numel());
    Acc* sum = grad_scratch_.ensure(n);
    if (local_params_[i]->name == "experts.batched_fc2_bias") {
      if (q != 0) wg.zero();  // parts other than 0 did not add the bias
      timed([&] { shard_group_->reduce_scatter(wg.raw(), sum, n, at, ReduceOp::sum); });
    } else if (b == 1) {
      std::memcpy(static_cast<void*>(sum), wg.raw(), sizeof(Acc) * n);
    } else {
      Acc* pieces = grad_pieces_.ensure(n * static_cast<size_t>(b));
      move_pieces(pieces, wg.template data<Acc>(), g.shape(), expert_split_dim(local_params_[i]->name), 1, b,
                  false);
      timed([&] { work.block->reduce_scatter(pieces, sum, n, at, ReduceOp::sum); });
    }
    add_into(g.template data<Acc>(), sum, static_cast<int64_t>(n));
  }
}

template <class S>
template <class T>
void ExpertParallelStage<S>::regroup(const T* src, T* dst, int64_t width, bool to_experts) const {
  int64_t at = 0;  // row in [source][local expert] order
  for (int s = 0; s < W_; ++s)
    for (int l = 0; l < L_; ++l) {
      const int64_t n = recv_counts_[static_cast<size_t>(s * L_ + l)];
      int64_t row = local_offsets_[static_cast<size_t>(l)];  // the expert's rows from sources before s
      for (int s2 = 0; s2 < s; ++s2) row += recv_counts_[static_cast<size_t>(s2 * L_ + l)];
      const T* from = to_experts ? src + at * width : src + row * width;
      T* to = to_experts ? dst + row * width : dst + at * width;
      std::memcpy(static_cast<void*>(to), from, sizeof(T) * static_cast<size_t>(n * width));
      at += n;
    }
}

template <class S>
void ExpertParallelStage<S>::exchange_rows(const void* send, void* recv, int64_t width, ElementType type,
                                           bool out) {
  std::vector<int64_t> sc(static_cast<size_t>(W_)), sd(sc.size()), rc(sc.size()), rd(sc.size());
  int64_t s_at = 0, r_at = 0;
  for (int w = 0; w < W_; ++w) {
    int64_t s_rows = 0, r_rows = 0;
    for (int l = 0; l < L_; ++l) {
      s_rows += sent_counts_[static_cast<size_t>(w * L_ + l)];
      r_rows += recv_counts_[static_cast<size_t>(w * L_ + l)];
    }
    const auto uw = static_cast<size_t>(w);
    sc[uw] = s_rows * width, sd[uw] = s_at * width, rc[uw] = r_rows * width, rd[uw] = r_at * width;
    s_at += s_rows, r_at += r_rows;
  }
  timed([&] {
    if (out)
      group_.all_to_all_v(send, sc, sd, recv, rc, rd, type);
    else
      group_.all_to_all_v(send, rc, rd, recv, sc, sd, type);
  });
}

template <class S>
void ExpertParallelStage<S>::forward_grouped(const Ops<S>& ops, const S* disp,
                                             std::span<const int64_t> offsets, int r, S* yd) {
  check_r(r);
  XMOE_CHECK(sc_ == 1, "execution: grouped (dropless) execution with each expert split over ranks (", E_,
             " experts over ", W_, " ranks) is not available; use padded");
  XMOE_CHECK(offsets.size() == static_cast<size_t>(E_) + 1,
             "expert parallel: grouped offsets need E + 1 entries");
  r_ = r;
  grouped_ = true;
  comm_seconds_ = 0;
  grouped_offsets_.assign(offsets.begin(), offsets.end());
  if (r == 0) {
    XMOE_CHECK(full_ != nullptr, "adaptive_r: 0 (data parallel) needs built-in experts");
    gather_all_experts();
    full_->forward(ops, disp, offsets, yd);
    return;
  }
  // Counts first: rows of each (destination rank, its local expert), received per (source, local expert).
  sent_counts_.resize(static_cast<size_t>(E_));
  recv_counts_.resize(static_cast<size_t>(E_));
  for (int e = 0; e < E_; ++e)
    sent_counts_[static_cast<size_t>(e)] =
        offsets[static_cast<size_t>(e) + 1] - offsets[static_cast<size_t>(e)];
  timed([&] {
    group_.all_to_all(sent_counts_.data(), recv_counts_.data(), static_cast<size_t>(L_), ElementType::i64);
  });
  local_offsets_.assign(static_cast<size_t>(L_) + 1, 0);
  for (int l = 0; l < L_; ++l) {
    int64_t n = 0;
    for (int s = 0; s < W_; ++s) n += recv_counts_[static_cast<size_t>(s * L_ + l)];
    local_offsets_[static_cast<size_t>(l) + 1] = local_offsets_[static_cast<size_t>(l)] + n;
  }
  const int64_t R = local_offsets_.back();
  const ElementType st = element_type_of<S>();
  S* recv = recv_.ensure(static_cast<size_t>(std::max<int64_t>(1, R * M_)));
  exchange_rows(disp, recv, M_, st, true);
  S* xl = x_local_.ensure(static_cast<size_t>(std::max<int64_t>(1, R * M_)));
  regroup(recv, xl, M_, true);
  S* yl = y_local_.ensure(static_cast<size_t>(std::max<int64_t>(1, R * O_)));
  local_.forward(ops, xl, local_offsets_, yl);
  S* back = send_back_.ensure(static_cast<size_t>(std::max<int64_t>(1, R * O_)));
  regroup(yl, back, O_, false);
  exchange_rows(back, yd, O_, st, false);
}

template <class S>
void ExpertParallelStage<S>::backward_grouped(const Ops<S>& ops, const S* disp, const S* dyd, Acc* dxd) {
  if (r_ == 0) {
    for (auto& p : full_params_) p->grad.zero();
    full_->backward(ops, disp, dyd, grouped_offsets_, {}, dxd);
    reduce_scatter_all_experts();
    return;
  }
  const int64_t R = local_offsets_.back();
  const ElementType st = element_type_of<S>(), at = element_type_of<Acc>();
  S* dr = dy_recv_.ensure(static_cast<size_t>(std::max<int64_t>(1, R * O_)));
  exchange_rows(dyd, dr, O_, st, true);
  S* dyl = dy_local_.ensure(static_cast<size_t>(std::max<int64_t>(1, R * O_)));
  regroup(dr, dyl, O_, true);
  Acc* dxl = dx_local_.ensure(static_cast<size_t>(std::max<int64_t>(1, R * M_)));
  // Local expert l's rows come from the sources in rank order (regroup), recv_counts_[s · L + l] each.
  std::vector<int64_t> cuts;
  for (int l = 0; l < L_; ++l) {
    int64_t row = local_offsets_[static_cast<size_t>(l)];
    for (int s = 0; s + 1 < W_; ++s) cuts.push_back(row += recv_counts_[static_cast<size_t>(s * L_ + l)]);
  }
  local_.backward(ops, x_local_.data(), dyl, local_offsets_, cuts, dxl);
  Acc* ds = dx_send_.ensure(static_cast<size_t>(std::max<int64_t>(1, R * M_)));
  regroup(dxl, ds, M_, false);
  exchange_rows(ds, dxd, M_, at, false);
}

template <class S>
size_t ExpertParallelStage<S>::workspace_bytes() const {
  size_t b = recv_.bytes() + x_local_.bytes() + y_local_.bytes() + send_back_.bytes() + chunk_send_.bytes() +
             chunk_recv_.bytes() + chunk_back_.bytes() + chunk_back_recv_.bytes() + dy_recv_.bytes() +
             dy_local_.bytes() + dx_local_.bytes() + dx_send_.bytes() + grad_scratch_.bytes() +
             pieces_.bytes() + grad_pieces_.bytes() + dx_chunk_send_.bytes() + dx_chunk_recv_.bytes();
  if (full_) b += full_->workspace_bytes();
  for (const auto& [r, w] : work_) b += w.experts->workspace_bytes();
  return b;
}

template class ExpertParallelStage<float>;
template class ExpertParallelStage<bf16>;
template class ExpertParallelStage<double>;

}  // namespace xmoe::moe
