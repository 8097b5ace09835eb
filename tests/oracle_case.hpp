// Loads the layer oracle fixtures written by tools/make_layer_fixtures.py. The fixtures are read with a
// small reader of its own (not xmoe::SafetensorsFile), so the oracle test depends only on the layer under
// test.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "xmoe/dtype.hpp"
#include "xmoe/tensor.hpp"

namespace xmoe::test {

struct StoredTensor {
  std::string dtype;  // "F32" | "F64" | "BF16"
  std::vector<int64_t> shape;
  std::vector<std::byte> bytes;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }

  // Every element as a double (exact for all three dtypes).
  std::vector<double> values() const {
    const auto n = static_cast<size_t>(numel());
    std::vector<double> out(n);
    for (size_t i = 0; i < n; ++i) {
      if (dtype == "F64") {
        std::memcpy(&out[i], bytes.data() + 8 * i, 8);
      } else if (dtype == "F32") {
        float f;
        std::memcpy(&f, bytes.data() + 4 * i, 4);
        out[i] = f;
      } else {
        uint16_t b;
        std::memcpy(&b, bytes.data() + 2 * i, 2);
        out[i] = bf16::to_float(b);
      }
    }
    return out;
  }

  Shape xmoe_shape() const { return Shape(std::span<const int64_t>(shape)); }

  // A tensor holding the stored bytes unchanged, in the stored dtype.
  Tensor tensor() const {
    const DType dt = parse_dtype(dtype);
    Tensor t = Tensor::empty(xmoe_shape(), dt);
    if (t.nbytes() != bytes.size()) throw std::runtime_error("stored tensor size mismatch");
    if (!bytes.empty()) std::memcpy(t.raw(), bytes.data(), bytes.size());
    return t;
  }

  // A tensor of the given dtype holding the stored values (exactly representable by construction).
  Tensor tensor_as(DType dt) const {
    Tensor t = Tensor::empty(xmoe_shape(), dt);
    const std::vector<double> v = values();
    for (size_t i = 0; i < v.size(); ++i) {
      if (dt == DType::f64) {
        t.data<double>()[i] = v[i];
      } else if (dt == DType::f32) {
        t.data<float>()[i] = static_cast<float>(v[i]);
      } else {
        t.data<bf16>()[i] = bf16(static_cast<float>(v[i]));
      }
    }
    return t;
  }
};

struct OracleCase {
  std::string file;
  nlohmann::json config;
  std::map<std::string, StoredTensor> tensors;

  const StoredTensor& at(const std::string& name) const {
    auto it = tensors.find(name);
    if (it == tensors.end()) throw std::runtime_error(file + ": missing tensor " + name);
    return it->second;
  }
  bool has(const std::string& name) const { return tensors.count(name) != 0; }
};

inline size_t stored_dtype_size(const std::string& dtype) {
  if (dtype == "F64") return 8;
  if (dtype == "F32") return 4;
  if (dtype == "BF16") return 2;
  throw std::runtime_error("unexpected fixture dtype " + dtype);
}

inline OracleCase load_oracle_case(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::vector<char> raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (raw.size() < 8) throw std::runtime_error(path + ": shorter than the header length");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i)
    header_len = (header_len << 8) | static_cast<unsigned char>(raw[static_cast<size_t>(i)]);
  if (header_len > raw.size() - 8) throw std::runtime_error(path + ": header past the end of the file");
  const nlohmann::json header =
      nlohmann::json::parse(raw.begin() + 8, raw.begin() + 8 + static_cast<ptrdiff_t>(header_len));
  const size_t data_begin = 8 + static_cast<size_t>(header_len);
  const size_t data_size = raw.size() - data_begin;

  OracleCase c;
  c.file = path;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      c.config = nlohmann::json::parse(entry.at("config").get<std::string>());
      continue;
    }
    StoredTensor t;
    t.dtype = entry.at("dtype").get<std::string>();
    t.shape = entry.at("shape").get<std::vector<int64_t>>();
    const auto offsets = entry.at("data_offsets").get<std::vector<size_t>>();
    if (offsets.size() != 2 || offsets[0] > offsets[1] || offsets[1] > data_size ||
        offsets[1] - offsets[0] != static_cast<size_t>(t.numel()) * stored_dtype_size(t.dtype)) {
      throw std::runtime_error(path + ": bad data_offsets for " + name);
    }
    const auto* first = reinterpret_cast<const std::byte*>(raw.data() + data_begin + offsets[0]);
    t.bytes.assign(first, first + (offsets[1] - offsets[0]));
    c.tensors.emplace(name, std::move(t));
  }
  if (c.config.is_null()) throw std::runtime_error(path + ": no __metadata__.config");
  return c;
}

// Every *.safetensors file in `dir`, sorted by name; empty when the directory is missing.
inline std::vector<std::string> list_oracle_cases(const std::string& dir) {
  std::vector<std::string> files;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    if (e.is_regular_file() && e.path().extension() == ".safetensors") files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace xmoe::test
