// A weight matrix as a checkpoint publishes it: its format is its own thing, separate from the activation
// type the model computes in. Loaders produce PackedWeight views (bytes stay in the mapped checkpoint where
// the layout allows); kernels consume them through the kernel table, keyed by (operation × format × ISA).
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>

namespace xmoe::kernels {

enum class WeightFormat : uint8_t {
  f32,        // float32 elements
  bf16,       // bfloat16 elements
  f16,        // IEEE binary16 elements
  fp8_block,  // float8_e4m3fn elements; one f32 multiplier per block_rows × block_cols block (DeepSeek
              // 128×128)
  mxfp4,      // E2M1 nibbles (element 2j = low nibble of byte j); one E8M0 scale per 1 × 32 block (OCP MX)
  nvfp4,      // E2M1 nibbles (same order); one E4M3 scale per 1 × 16 block, times an f32 global scale
};
inline constexpr int kWeightFormatCount = 6;
const char* weight_format_name(WeightFormat f);  // "f32", "bf16", "f16", "fp8_block", "mxfp4", "nvfp4"

enum class ScaleType : uint8_t { none, f32, e8m0, e4m3 };

// A read-only view of one [rows, cols] matrix in nn.Linear layout (row n = output n, column k = input k).
// The bytes are owned elsewhere (the mapped checkpoint, or a buffer the loader keeps alive).
struct PackedWeight {
  WeightFormat format = WeightFormat::f32;
  int64_t rows = 0, cols = 0;
  const std::byte* data = nullptr;  // row r starts at data + r * row_bytes
  int64_t row_bytes = 0;
  // Block scales (none for f32/bf16/f16): element (r, c) is multiplied by
  // scale[(r / block_rows) * scale_row_stride + c / block_cols], decoded from scale_type.
  ScaleType scale_type = ScaleType::none;
  const std::byte* scales = nullptr;
  int64_t scale_row_stride = 0;  // in scale elements
  int block_rows = 1, block_cols = 1;
  float global_scale = 1.0f;  // multiplies every element (NVFP4's weight_scale_2); 1 for the other formats
  // FP8 block, optional: one flag per row of this view, which the decode tiles and prefill panels set once
  // they have read the whole row and met no NaN code (S.1111.111), and on which the decode tiles (few x
  // rows) then leave that check out (a running max per 16-64 codes: 4-14 % of one thread's decode from L2 by
  // level and precision; from DRAM 7-8 % of an AVX2 step's FP8 time, ~1 % at AVX-512). Only for bytes that
  // stay as they are while the weight lives: the loader attaches flags it owns to a checkpoint's FP8
  // weights; views without them (null) are checked on every call.
  std::atomic<uint8_t>* nan_free_rows = nullptr;

  // Whether rows [n, n + count) are known to hold no NaN code.
  bool rows_nan_free(int64_t n, int64_t count) const {
    if (nan_free_rows == nullptr) return false;
    for (int64_t r = n; r < n + count; ++r)
      if (nan_free_rows[r].load(std::memory_order_relaxed) == 0) return false;
    return true;
  }
  // Records that rows [n, n + count) hold no NaN code (where this view has flags).
  void mark_rows_nan_free(int64_t n, int64_t count) const {
    if (nan_free_rows == nullptr) return;
    for (int64_t r = n; r < n + count; ++r) nan_free_rows[r].store(1, std::memory_order_relaxed);
  }
  // A decode tile over rows [n, n + count): tile.template operator()<Checked>() returns false when it met a
  // NaN code (only where Checked). Unchecked where the rows are flagged; else checked, flagging the rows when
  // they were clean. Returns the tile's result.
  template <class Tile>
  bool decode_rows_nan_checked(int64_t n, int64_t count, Tile&& tile) const {
    if (rows_nan_free(n, count)) return tile.template operator()<false>();
    if (!tile.template operator()<true>()) return false;
    mark_rows_nan_free(n, count);
    return true;
  }

  // Bytes one full pass over the matrix reads (elements and scales), for bandwidth figures.
  size_t bytes() const;
  // Row r decoded to f32, exactly as PyTorch dequantises it (the reference decode; embeddings use it too).
  void row_to_f32(int64_t r, float* out) const;
};

// y[i, n] = Σ_k x[i, k] · W[n, k] for rows i in [0, m) and output columns n in [n0, n1); x is f32 with row
// stride ldx, y f32 with row stride ldy. Single-threaded: callers split columns over threads
// (kernels/linear.hpp). Determinism: each output's summation order depends only on k (never on m, n, the
// column block or the thread count), so a sequence's results do not depend on the rest of its batch.
struct LinearArgs {
  const float* x = nullptr;
  int64_t m = 0, ldx = 0;
  const PackedWeight* w = nullptr;
  int64_t n0 = 0, n1 = 0;
  float* y = nullptr;
  int64_t ldy = 0;
};
using LinearFn = void (*)(const LinearArgs& args);

}  // namespace xmoe::kernels
