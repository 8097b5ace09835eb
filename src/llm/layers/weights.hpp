// The model's weights as the kernels read them: PackedWeight views over the memory-mapped checkpoint where
// the layout allows (a BF16 checkpoint run in bf16, an F32 one in f32), or over buffers this loader owns when
// the model's dtype asks for a conversion (a BF16 checkpoint computed with f32 weights).
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/packed_weight.hpp"
#include "llm/checkpoint.hpp"
#include "xmoe/dtype.hpp"

namespace xmoe::llm {

class WeightLoader {
 public:
  // dtype: the model's dtype. f32 computes every float weight in f32 (converted exactly); bf16 reads BF16 and
  // F16 tensors in place and rounds F32 ones to bf16. Quantized weights (quantized_views.hpp) are read in
  // place whatever the dtype: activations are f32 and the kernels decode the codes.
  WeightLoader(const Checkpoint& ckpt, DType dtype);
  // Moving keeps every view valid (the owned buffers and the mappings move, their bytes stay where they are).
  WeightLoader(WeightLoader&&) = default;
  WeightLoader& operator=(WeightLoader&&) = default;

  // The 2-D weight `name`, checked to be [rows, cols] (a 1-D [cols] tensor when rows is 0: one row).
  kernels::PackedWeight matrix(const std::string& name, int64_t rows, int64_t cols);
  // Expert e's [rows, cols] slice of the 3-D weight `name` [count, rows, cols], for every e (fused experts).
  std::vector<kernels::PackedWeight> stacked(const std::string& name, int64_t count, int64_t rows,
                                             int64_t cols);

  // Bytes copied into buffers of our own (0 when every weight is mapped in place).
  size_t owned_bytes() const { return owned_bytes_; }
  // Checkpoint bytes of every weight loaded so far (codes and scales of quantized ones).
  size_t checkpoint_bytes() const { return checkpoint_bytes_; }

 private:
  // `view` as a [rows, cols] matrix in the model's compute format, converting when needed.
  kernels::PackedWeight convert_or_map(const WeightView& view, int64_t rows, int64_t cols);
  // An FP8 view with NaN-free row flags of its own (PackedWeight::nan_free_rows): a checkpoint's bytes stay
  // as they are while the model lives, so a row the kernels have found clean once need not be checked again.
  kernels::PackedWeight with_nan_flags(kernels::PackedWeight w);

  Checkpoint ckpt_;  // a copy: its shared mappings stay alive as long as the views into them
  DType dtype_;
  std::vector<std::unique_ptr<std::byte[]>> owned_;
  std::vector<std::unique_ptr<std::atomic<uint8_t>[]>> nan_flags_;
  size_t owned_bytes_ = 0, checkpoint_bytes_ = 0;
};

// A norm's weight vector [n] in f32 (norm weights stay f32 whatever the model dtype; exact from bf16).
std::vector<float> load_vector(const Checkpoint& ckpt, const std::string& name, int64_t n);

}  // namespace xmoe::llm
