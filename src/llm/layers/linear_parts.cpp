#include "llm/layers/linear_parts.hpp"

#include <algorithm>

#include "kernels/column_split.hpp"
#include "kernels/linear.hpp"
#include "xmoe/error.hpp"

namespace xmoe::llm {

namespace {

// Output columns per unit of the split: the linear driver's column block (the kernels' tile).
constexpr int64_t kBlock = 8;

// Units [u0, u1) of the parts' units laid end to end, each part's share computed on the calling thread.
void run_units(const kernels::KernelTable& table, std::span<const kernels::PackedWeight> parts,
               const float* x, int64_t m, int64_t ldx, float* y, int64_t ldy, int64_t u0, int64_t u1) {
  int64_t first_unit = 0, col = 0;
  for (const kernels::PackedWeight& w : parts) {
    const int64_t units = (w.rows + kBlock - 1) / kBlock;
    const int64_t a = std::max(u0, first_unit), b = std::min(u1, first_unit + units);
    if (a < b)
      kernels::linear_forward_columns(table, w, x, m, ldx, (a - first_unit) * kBlock,
                                      std::min(w.rows, (b - first_unit) * kBlock), y + col, ldy);
    first_unit += units;
    col += w.rows;
  }
}

}  // namespace

void linear_forward_parts(const kernels::KernelTable& table, std::span<const kernels::PackedWeight> parts,
                          const float* x, int64_t m, int64_t ldx, float* y, int64_t ldy) {
  if (parts.size() == 1) {
    kernels::linear_forward(table, parts[0], x, m, ldx, y, ldy);
    return;
  }
  int64_t units = 0, rows = 0, bytes = 0;
  for (const kernels::PackedWeight& w : parts) {
    XMOE_CHECK(w.cols == parts[0].cols, "linear parts: a part has ", w.cols, " columns, the first ",
               parts[0].cols);
    units += (w.rows + kBlock - 1) / kBlock;
    rows += w.rows;
    bytes += w.rows * w.row_bytes;
  }
  if (m == 0 || units == 0) return;
  XMOE_CHECK(ldy >= rows, "linear parts: output rows ", ldy, " apart hold fewer than the parts' ", rows);
  const int threads = kernels::threads_for_macs(static_cast<double>(m) * static_cast<double>(rows) *
                                                static_cast<double>(parts[0].cols));
  kernels::split_columns(threads, m, units, bytes,
                         [&](int64_t u0, int64_t u1) { run_units(table, parts, x, m, ldx, y, ldy, u0, u1); });
}

}  // namespace xmoe::llm
