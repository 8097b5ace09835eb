// A Hugging Face checkpoint directory: config.json plus one safetensors file or shards listed by
// model.safetensors.index.json, all memory-mapped. Tensors are looked up by name across shards.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "llm/model_config.hpp"
#include "llm/quantization.hpp"
#include "xmoe/safetensors.hpp"

namespace xmoe::llm {

// A tensor's dtype as the safetensors header gives it. F32/F16/BF16 hold values; F8_E4M3 and U8 hold the
// codes and scales of quantized weights (quantization.hpp), read as PackedWeight views by the loader and
// decoded inside the kernels rather than expanded into a dequantized copy.
enum class TensorDType { f32, f16, bf16, f8_e4m3, u8 };
const char* tensor_dtype_name(TensorDType t);  // the safetensors spelling: "F32", "F8_E4M3", ...

// A read-only view of one tensor of the checkpoint (the bytes stay in the mapped file).
struct WeightView {
  std::string name;
  TensorDType dtype = TensorDType::f32;
  std::vector<int64_t> shape;
  std::span<const std::byte> bytes;
  int64_t numel() const;
  // Converts elements [offset, offset + count) to f32 (F32/F16/BF16) / to bf16 bits (exact from bf16;
  // rounded to nearest even from f32/f16). Quantized codes (F8_E4M3, U8) throw: they are read as packed
  // weights.
  void to_f32(int64_t offset, int64_t count, float* out) const;
  void to_bf16(int64_t offset, int64_t count, uint16_t* out) const;
};

// Progress of opening/loading: done and total bytes (called from one thread).
using ProgressFn = std::function<void(size_t done, size_t total)>;

class Checkpoint {
 public:
  // Opens dir/config.json and dir/model.safetensors, or the shards named by dir/model.safetensors.index.json
  // (every shard in the index must exist; every tensor the index names must be in its shard).
  // As in transformers, model.safetensors wins when both exist, and tensors a shard holds that the index does
  // not name are ignored; a tensor held by two shards is an error (the checkpoint is ambiguous).
  // Throws xmoe::Error naming the file and what is wrong.
  static Checkpoint open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  const ModelConfig& config() const { return config_; }
  const QuantizationConfig& quantization() const { return quantization_; }
  bool contains(const std::string& name) const;
  // Throws naming the checkpoint and tensor when missing, when the dtype is not a supported TensorDType, or
  // when `expected_shape` is given and differs.
  WeightView weight(const std::string& name, std::span<const int64_t> expected_shape = {}) const;
  std::vector<std::string> tensor_names() const;
  size_t total_bytes() const;
  // Maps every tensor's bytes into the page tables now (SafetensorsFile::prefault), file by file in chunks of
  // at most 256 MiB so `progress` moves; stops at the first failure.
  struct PrefaultResult {
    size_t bytes = 0;  // populated
    int error = 0;     // errno of the failed call, 0 when all succeeded
    std::string file;  // the file it failed on
  };
  PrefaultResult prefault(const ProgressFn& progress = {}) const;
  // How much of the files the kernel maps with 2 MiB entries now, of the most it could (io/page_cache.hpp).
  struct HugePages {
    size_t mapped = 0, mappable = 0;
  };
  HugePages huge_pages() const;
  // Drops the files' page-cache pages (io::drop_cached_pages), so that the next prefault reads them from disk
  // into 2 MiB pages. Stops at the first failure (its errno and file; `bytes` stays 0).
  PrefaultResult drop_cached_pages() const;

 private:
  std::string dir_;
  ModelConfig config_;
  QuantizationConfig quantization_;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::vector<std::pair<std::string, size_t>> index_;  // sorted tensor name → file
};

}  // namespace xmoe::llm
