// A linear layer over a weight in any format: y = x · Wᵀ through the kernel table's linear kernel for the
// weight's format, with the output columns split over OpenMP threads. Each output is computed by one thread
// in the kernel's fixed summation order, so results do not depend on the thread count or the batch.
#pragma once
#include <cstdint>
#include <optional>
#include <span>

#include "kernels/kernels.hpp"

namespace xmoe::kernels {

// y[i, n] = Σ_k x[i, k] · W[n, k] for i < m and n < w.rows; x rows ldx apart (≥ w.cols), y rows ldy apart
// (≥ w.rows). Throws naming the format when the table has no kernel for it.
void linear_forward(const KernelTable& table, const PackedWeight& w, const float* x, int64_t m, int64_t ldx,
                    float* y, int64_t ldy);
// Threads worth starting for `macs` multiply-adds: enough work per thread to pay for the team, at most
// OpenMP's maximum, 1 inside a parallel region. The linear driver and the MoE experts' schedule size teams by
// it.
int threads_for_macs(double macs);
// Output columns [n0, n1) of linear_forward on the calling thread alone, for callers that schedule many
// products over their own threads (the experts of a MoE layer). Any column split gives the bits of the whole
// product: each output's summation order depends only on k.
void linear_forward_columns(const KernelTable& table, const PackedWeight& w, const float* x, int64_t m,
                            int64_t ldx, int64_t n0, int64_t n1, float* y, int64_t ldy);
// Dense x [m, w.cols] and y [m, w.rows].
inline void linear_forward(const KernelTable& table, const PackedWeight& w, const float* x, int64_t m,
                           float* y) {
  linear_forward(table, w, x, m, w.cols, y, w.rows);
}

// One view over weights that lie back to back in memory with the same format and columns (q/k/v, gate/up
// of one checkpoint), so one call streams them all; nullopt when they do not (a different format, a gap, or
// block scales, whose rows would need to line up with the blocks too).
std::optional<PackedWeight> join_rows(std::span<const PackedWeight> parts);

// Rows [row0, row0 + rows) of `w` as a view (scales included); row0 must start a block of scale rows.
PackedWeight slice_rows(const PackedWeight& w, int64_t row0, int64_t rows);

}  // namespace xmoe::kernels
