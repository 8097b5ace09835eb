#include "moe/expert_parallel.hpp"

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

template <class S>
ExpertParallelStage<S>::ExpertParallelStage(const MoeConfig& c, Communicator& group, Experts<S>& local,
                                            std::vector<Parameter*> local_params)
    : group_(group),
      local_(local),
      local_params_(std::move(local_params)),
      W_(group.size()),
      L_(c.experts.num_experts / group.size()),
      E_(c.experts.num_experts),
      M_(c.model_dim),
      O_(local.output_dim()) {
  if (c.experts.type != "custom") full_ = make_experts<S>(c, whole_model_shard(c), full_params_);
  if (c.use_2dh) two_dim_ = std::make_unique<HierarchicalAllToAll>(group, c.local_size);
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
  C_ = C;
  r_ = r;
  comm_seconds_ = 0;
  const ElementType st = element_type_of<S>();
  if (r == 0) {
    XMOE_CHECK(full_ != nullptr, "adaptive_r: 0 (data parallel) needs built-in experts");
    // Every rank gathers all experts' parameters and runs them on its own tokens.
    for (size_t i = 0; i < local_params_.size(); ++i) {
      const Tensor& v = local_params_[i]->value;
      const auto t0 = std::chrono::steady_clock::now();
      group_.all_gather(v.raw(), full_params_[i]->value.raw(), static_cast<size_t>(v.numel()), st);
      comm_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    std::vector<int64_t> offsets(static_cast<size_t>(E_) + 1);
    for (int e = 0; e <= E_; ++e) offsets[static_cast<size_t>(e)] = e * C;
    full_->forward(ops, disp, offsets, yd);
    return;
  }
  if (overlap > 1 && local_.supports_row_ranges() && C % overlap == 0 && C > 0) {
    forward_overlapped(ops, disp, overlap, yd);
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

// Capacity in D chunks: chunk d's all-to-all is in flight while chunk d−1's experts run, and each chunk's
// outputs start home as soon as they exist. Every row is computed exactly as without chunks, so results are
// bit-identical; rows land in the same [L][W][C] buffer, so backward is unchanged.
template <class S>
void ExpertParallelStage<S>::forward_overlapped(const Ops<S>& ops, const S* disp, int D, S* yd) {
  const ElementType st = element_type_of<S>();
  const int64_t C = C_, Cd = C / D, R = static_cast<int64_t>(E_) * C, WL = static_cast<int64_t>(W_) * L_;
  const int64_t chunk_in = WL * Cd * M_, chunk_out = WL * Cd * O_;
  S* xl = x_local_.ensure(static_cast<size_t>(R * M_));
  S* yl = y_local_.ensure(static_cast<size_t>(R * O_));
  S* send = chunk_send_.ensure(static_cast<size_t>(D * chunk_in));
  S* recv = chunk_recv_.ensure(static_cast<size_t>(D * chunk_in));
  S* back = chunk_back_.ensure(static_cast<size_t>(D * chunk_out));
  S* back_recv = chunk_back_recv_.ensure(static_cast<size_t>(D * chunk_out));
  // Slots [d·Cd, (d+1)·Cd) of every expert, packed as [W][L][Cd][M].
  for (int d = 0; d < D; ++d)
    for (int64_t e = 0; e < WL; ++e)
      std::memcpy(static_cast<void*>(send + d * chunk_in + e * Cd * M_), disp + (e * C + d * Cd) * M_,
                  sizeof(S) * static_cast<size_t>(Cd * M_));
  std::vector<std::unique_ptr<CommRequest>> in(static_cast<size_t>(D)), out(static_cast<size_t>(D));
  in[0] = group_.all_to_all_async(send, recv, static_cast<size_t>(L_ * Cd * M_), st);
  for (int d = 0; d < D; ++d) {
    auto t0 = std::chrono::steady_clock::now();
    in[static_cast<size_t>(d)]->wait();
    comm_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (d + 1 < D)
      in[static_cast<size_t>(d) + 1] = group_.all_to_all_async(
          send + (d + 1) * chunk_in, recv + (d + 1) * chunk_in, static_cast<size_t>(L_ * Cd * M_), st);
    ranges_.clear();
    const S* rc = recv + d * chunk_in;  // [W][L][Cd][M] from every source rank
    for (int64_t w = 0; w < W_; ++w)
      for (int64_t l = 0; l < L_; ++l) {
        const int64_t row = (l * W_ + w) * C + d * Cd;
        std::memcpy(static_cast<void*>(xl + row * M_), rc + (w * L_ + l) * Cd * M_,
                    sizeof(S) * static_cast<size_t>(Cd * M_));
        ranges_.push_back({l, row, row + Cd});
      }
    local_.forward_rows(ops, xl, ranges_, R, yl);
    S* bc = back + d * chunk_out;
    for (int64_t w = 0; w < W_; ++w)
      for (int64_t l = 0; l < L_; ++l)
        std::memcpy(static_cast<void*>(bc + (w * L_ + l) * Cd * O_), yl + ((l * W_ + w) * C + d * Cd) * O_,
                    sizeof(S) * static_cast<size_t>(Cd * O_));
    out[static_cast<size_t>(d)] =
        group_.all_to_all_async(bc, back_recv + d * chunk_out, static_cast<size_t>(L_ * Cd * O_), st);
  }
  for (int d = 0; d < D; ++d) {
    const auto t0 = std::chrono::steady_clock::now();
    out[static_cast<size_t>(d)]->wait();
    comm_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const S* br = back_recv + d * chunk_out;  // [W][L][Cd][O] = this rank's experts' slots of chunk d
    for (int64_t e = 0; e < WL; ++e)
      std::memcpy(static_cast<void*>(yd + (e * C + d * Cd) * O_), br + e * Cd * O_,
                  sizeof(S) * static_cast<size_t>(Cd * O_));
  }
}

template <class S>
void ExpertParallelStage<S>::backward(const Ops<S>& ops, const S* disp, const S* dyd, Acc* dxd) {
  const int64_t C = C_, R = static_cast<int64_t>(E_) * C;
  const ElementType st = element_type_of<S>(), at = element_type_of<Acc>();
  if (r_ == 0) {
    std::vector<int64_t> offsets(static_cast<size_t>(E_) + 1);
    for (int e = 0; e <= E_; ++e) offsets[static_cast<size_t>(e)] = e * C;
    for (auto& p : full_params_) p->grad.zero();
    full_->backward(ops, disp, dyd, offsets, dxd);
    // Each owner receives the sum over ranks of its experts' gradients (Tutel's zero_gather backward).
    for (size_t i = 0; i < local_params_.size(); ++i) {
      Tensor& g = local_params_[i]->grad;
      const auto n = static_cast<size_t>(g.numel());
      Acc* sum = grad_scratch_.ensure(n);
      const auto t0 = std::chrono::steady_clock::now();
      group_.reduce_scatter(full_params_[i]->grad.raw(), sum, n, at, ReduceOp::sum);
      comm_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      Acc* dst = g.template data<Acc>();
      for (size_t j = 0; j < n; ++j) dst[j] += sum[j];
    }
    return;
  }
  S* dr = dy_recv_.ensure(static_cast<size_t>(R * O_));
  all_to_all(dyd, dr, static_cast<size_t>(L_ * C * O_), st);
  S* dyl = dy_local_.ensure(static_cast<size_t>(R * O_));
  transpose_blocks(dr, dyl, W_, L_, C * O_);
  std::vector<int64_t> offsets(static_cast<size_t>(L_) + 1);
  for (int l = 0; l <= L_; ++l) offsets[static_cast<size_t>(l)] = l * W_ * C;
  Acc* dxl = dx_local_.ensure(static_cast<size_t>(R * M_));
  local_.backward(ops, x_local_.data(), dyl, offsets, dxl);
  Acc* ds = dx_send_.ensure(static_cast<size_t>(R * M_));
  transpose_blocks(dxl, ds, L_, W_, C * M_);
  all_to_all(ds, dxd, static_cast<size_t>(L_ * C * M_), at);
}

template <class S>
size_t ExpertParallelStage<S>::workspace_bytes() const {
  size_t b = recv_.bytes() + x_local_.bytes() + y_local_.bytes() + send_back_.bytes() + chunk_send_.bytes() +
             chunk_recv_.bytes() + chunk_back_.bytes() + chunk_back_recv_.bytes() + dy_recv_.bytes() +
             dy_local_.bytes() + dx_local_.bytes() + dx_send_.bytes() + grad_scratch_.bytes();
  if (full_) b += full_->workspace_bytes();
  return b;
}

template class ExpertParallelStage<float>;
template class ExpertParallelStage<bf16>;
template class ExpertParallelStage<double>;

}  // namespace xmoe::moe
