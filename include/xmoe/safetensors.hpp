// Reading (mmap, validated header) and writing safetensors files.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "xmoe/tensor.hpp"

namespace xmoe {

struct SafetensorsEntry {
  std::string name;
  std::string dtype;  // as written in the file: "F32", "BF16", "F8_E4M3", "U8", ...
  std::vector<int64_t> shape;
  size_t begin = 0, end = 0;  // byte offsets relative to the start of the data section
};

class SafetensorsFile {
 public:
  // Maps the file and validates the header: JSON shape, known dtypes, offsets in bounds, sizes equal to
  // dtype size × shape, no overlapping ranges, __metadata__ values strings. Errors name the file and tensor.
  static SafetensorsFile open(const std::string& path);

  const std::string& path() const { return path_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }  // in data-offset order
  bool contains(const std::string& name) const;
  const SafetensorsEntry& entry(const std::string& name) const;  // throws naming the file and tensor
  std::span<const std::byte> bytes(const std::string& name) const;
  // A Tensor view (F32, F64, BF16) sharing the mapping, or a copy when the data is unaligned for the dtype.
  // Views are read-only (the file is mapped PROT_READ): clone() before writing to the result.
  Tensor tensor(const std::string& name) const;
  // Maps data bytes [begin, end) (offsets into the data section) into the page tables now, reading from disk
  // what the page cache lacks, so that later reads of them take no page fault. Returns 0, or the errno of
  // madvise(MADV_POPULATE_READ) (EINVAL on kernels before 5.14, EFAULT if the file shrank).
  int prefault(size_t begin, size_t end) const;
  // The whole file as mapped (read-only, MAP_PRIVATE, advised MADV_HUGEPAGE).
  std::span<const std::byte> mapping() const {
    return {static_cast<const std::byte*>(mapping_.get()), mapping_size_};
  }

 private:
  std::string path_;
  std::shared_ptr<void> mapping_;  // unmapped when the last view is gone
  size_t mapping_size_ = 0;
  const std::byte* data_ = nullptr;
  size_t data_size_ = 0;
  std::map<std::string, std::string> metadata_;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t> index_;
};

// A tensor written from raw little-endian bytes, in any dtype the reader accepts; its pieces go back to back.
struct SafetensorsRawTensor {
  std::string name;
  std::string dtype;  // "F32", "BF16", "F8_E4M3", "U8", ...
  std::vector<int64_t> shape;
  std::vector<std::span<const std::byte>> pieces;
};

// Writes raw tensors with the same layout and guarantees as save_safetensors (8-byte aligned data section,
// temporary file renamed into place). Checks names only: the caller vouches that bytes match dtype × shape.
void save_safetensors_raw(const std::string& path, const std::vector<SafetensorsRawTensor>& tensors,
                          const std::map<std::string, std::string>& metadata = {});

// Writes tensors (F32/F64/BF16) contiguously in the given order, with string metadata. The header is padded
// with spaces so the data section starts 8-byte aligned. Writes to a temporary file and renames it, so a
// failed save leaves any previous file intact.
void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

}  // namespace xmoe
