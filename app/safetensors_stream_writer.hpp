// Writes one safetensors file whose tensors are produced piece by piece, so a file far larger than memory
// can be written: the header (names, dtypes, shapes, offsets) is fixed up front, the data streamed after it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

namespace xmoe::app {

struct StreamedTensor {
  std::string name;
  std::string dtype;  // "F32", "BF16", ...
  std::vector<int64_t> shape;
  size_t nbytes = 0;  // dtype size × elements; the caller vouches for it
};

class SafetensorsStreamWriter {
 public:
  // Creates path + ".tmp" and writes the header (8-byte aligned data section, as save_safetensors_raw).
  SafetensorsStreamWriter(std::string path, const std::vector<StreamedTensor>& tensors,
                          const std::map<std::string, std::string>& metadata);
  ~SafetensorsStreamWriter();  // removes the temporary file when finish() was not reached
  SafetensorsStreamWriter(const SafetensorsStreamWriter&) = delete;
  SafetensorsStreamWriter& operator=(const SafetensorsStreamWriter&) = delete;

  // Appends data bytes in tensor order; throws when more than the header announced is written.
  void write(std::span<const std::byte> bytes);
  // Checks that every announced byte was written, then renames the file into place.
  void finish();

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  uint64_t expected_ = 0, written_ = 0;
};

}  // namespace xmoe::app
