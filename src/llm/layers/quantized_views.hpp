// PackedWeight views of a checkpoint's quantized linears, in the layouts the quantization schemes publish
// (quantization.hpp): codes and scales stay in the mapped files. Which tensors are quantized is read from the
// safetensors header (a tensor's dtype, or which of a module's tensors exist), never from the config alone.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "kernels/packed_weight.hpp"
#include "llm/checkpoint.hpp"

namespace xmoe::llm {

// The linear `name` ("<module>.weight", [rows, cols] in nn.Linear layout) as a quantized view, or nullopt
// when the checkpoint holds it as plain values under `name`. count > 0 reads a fused 3-D tensor
// [count, rows, cols] as one view of count·rows rows (slice it per expert). Throws naming the tensor and
// field when a scale tensor is missing or misshapen, a dimension does not divide into the format's blocks,
// a module listed as unconverted is quantized, or quantized codes appear without a quantization config.
std::optional<kernels::PackedWeight> quantized_view(const Checkpoint& ckpt, const std::string& name,
                                                    int64_t rows, int64_t cols, int64_t count = 0);

// Whether the checkpoint holds the linear `name` in any layout: plain or quantized under `name`, or as
// quantized tensors named after it (<name>_blocks, <module>.weight_packed).
bool holds_linear(const Checkpoint& ckpt, const std::string& name);

}  // namespace xmoe::llm
