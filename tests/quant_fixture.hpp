// Reading the quantized-format oracle fixtures (tools/make_quant_fixtures.py → tests/data/quant).
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "xmoe/dtype.hpp"
#include "xmoe/safetensors.hpp"

namespace xmoe::test {

inline SafetensorsFile quant_fixture(const std::string& name) {
  return SafetensorsFile::open(std::string(XMOE_TEST_DATA_DIR) + "/quant/" + name + ".safetensors");
}

template <class T>
std::vector<T> fixture_values(const SafetensorsFile& f, const std::string& name) {
  const auto bytes = f.bytes(name);
  std::vector<T> out(bytes.size() / sizeof(T));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(T));
  return out;
}

// A BF16 fixture tensor widened to f32.
inline std::vector<float> fixture_bf16_as_f32(const SafetensorsFile& f, const std::string& name) {
  const auto raw = fixture_values<uint16_t>(f, name);
  std::vector<float> out(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) out[i] = bf16::to_float(raw[i]);
  return out;
}

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Equal bits, or both NaN (payloads are not part of any format's contract).
inline bool same_float(float a, float b) {
  return float_bits(a) == float_bits(b) || (a != a && b != b);
}

}  // namespace xmoe::test
