// A safetensors file of arbitrary bytes: header length, JSON header, tensor table, data section. Opening must
// either give entries whose byte ranges lie inside the file or throw xmoe::Error; then every tensor is read.
#include <cstdint>

#include "fuzz_support.hpp"
#include "xmoe/error.hpp"
#include "xmoe/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const xmoe::fuzz::ScratchDir dir;
  dir.write("model.safetensors", xmoe::fuzz::as_text(data, size));
  try {
    const xmoe::SafetensorsFile f = xmoe::SafetensorsFile::open(dir.file("model.safetensors"));
    unsigned sum = 0;
    for (const auto& e : f.entries()) {
      for (const std::byte b : f.bytes(e.name)) sum += static_cast<unsigned>(b);
      try {
        const xmoe::Tensor t = f.tensor(e.name);
        sum += static_cast<unsigned>(t.nbytes());
      } catch (const xmoe::Error&) {
      }
    }
    volatile unsigned sink = sum;
    (void)sink;
  } catch (const xmoe::Error&) {
  }
  return 0;
}
