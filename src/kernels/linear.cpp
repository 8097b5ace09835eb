#include "kernels/linear.hpp"

#include <omp.h>

#include <algorithm>

#include "kernels/column_split.hpp"
#include "xmoe/error.hpp"

namespace xmoe::kernels {

namespace {

LinearFn kernel_for(const KernelTable& table, const PackedWeight& w) {
  const LinearFn fn = table.linear[static_cast<size_t>(w.format)];
  XMOE_CHECK(fn != nullptr, "linear: no ", isa_name(table.isa), " kernel for weights in format ",
             weight_format_name(w.format));
  return fn;
}

}  // namespace

int threads_for_macs(double macs) {
  if (omp_in_parallel()) return 1;
  return static_cast<int>(std::clamp(macs / (1 << 16), 1.0, double(omp_get_max_threads())));
}

void linear_forward_columns(const KernelTable& table, const PackedWeight& w, const float* x, int64_t m,
                            int64_t ldx, int64_t n0, int64_t n1, float* y, int64_t ldy) {
  const LinearFn fn = kernel_for(table, w);
  XMOE_CHECK(0 <= n0 && n0 <= n1 && n1 <= w.rows, "linear: output columns [", n0, ", ", n1, ") outside [0, ",
             w.rows, ")");
  if (m == 0 || n0 == n1) return;
  fn(LinearArgs{x, m, ldx, &w, n0, n1, y, ldy});
}

void linear_forward(const KernelTable& table, const PackedWeight& w, const float* x, int64_t m, int64_t ldx,
                    float* y, int64_t ldy) {
  const LinearFn fn = kernel_for(table, w);
  const int64_t n = w.rows;
  if (m == 0 || n == 0) return;
  LinearArgs args{x, m, ldx, &w, 0, n, y, ldy};
  // Column blocks are whole multiples of 8 (the kernels' tile).
  const int threads =
      threads_for_macs(static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(w.cols));
  split_columns(threads, m, (n + 7) / 8, n * w.row_bytes, [&](int64_t b0, int64_t b1) {
    LinearArgs part = args;
    part.n0 = b0 * 8;
    part.n1 = std::min(n, b1 * 8);
    fn(part);
  });
}

std::optional<PackedWeight> join_rows(std::span<const PackedWeight> parts) {
  if (parts.empty()) return std::nullopt;
  PackedWeight joined = parts[0];
  for (size_t i = 1; i < parts.size(); ++i) {
    const PackedWeight& p = parts[i];
    const bool adjacent = p.format == joined.format && p.cols == joined.cols &&
                          p.row_bytes == joined.row_bytes && p.scale_type == ScaleType::none &&
                          joined.scale_type == ScaleType::none &&
                          p.data == joined.data + joined.rows * joined.row_bytes;
    if (!adjacent) return std::nullopt;
    joined.rows += p.rows;
  }
  return joined;
}

PackedWeight slice_rows(const PackedWeight& w, int64_t row0, int64_t rows) {
  XMOE_CHECK(row0 >= 0 && rows >= 0 && row0 + rows <= w.rows && row0 % w.block_rows == 0,
             "packed weight: rows [", row0, ", ", row0 + rows, ") of ", w.rows,
             " are not a slice starting a block of ", w.block_rows);
  PackedWeight s = w;
  s.rows = rows;
  s.data = w.data + row0 * w.row_bytes;
  if (w.nan_free_rows != nullptr) s.nan_free_rows = w.nan_free_rows + row0;
  if (w.scale_type != ScaleType::none) {
    const int64_t scale_size = w.scale_type == ScaleType::f32 ? 4 : 1;
    s.scales = w.scales + row0 / w.block_rows * w.scale_row_stride * scale_size;
  }
  return s;
}

}  // namespace xmoe::kernels
