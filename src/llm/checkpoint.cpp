#include "llm/checkpoint.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "io/page_cache.hpp"
#include "util/text_file.hpp"
#include "xmoe/dtype.hpp"
#include "xmoe/error.hpp"

namespace xmoe::llm {

const char* tensor_dtype_name(TensorDType f) {
  switch (f) {
    case TensorDType::f32:
      return "F32";
    case TensorDType::f16:
      return "F16";
    case TensorDType::bf16:
      return "BF16";
    case TensorDType::f8_e4m3:
      return "F8_E4M3";
    case TensorDType::u8:
      return "U8";
  }
  return "?";
}

namespace {

using json = nlohmann::json;

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

bool is_regular_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string shape_str(std::span<const int64_t> shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

bool dtype_of(const std::string& name, TensorDType& out) {
  if (name == "F32")
    out = TensorDType::f32;
  else if (name == "F16")
    out = TensorDType::f16;
  else if (name == "BF16")
    out = TensorDType::bf16;
  else if (name == "F8_E4M3")
    out = TensorDType::f8_e4m3;
  else if (name == "U8")
    out = TensorDType::u8;
  else
    return false;
  return true;
}

size_t element_size(TensorDType f) {
  switch (f) {
    case TensorDType::f32:
      return 4;
    case TensorDType::f16:
    case TensorDType::bf16:
      return 2;
    case TensorDType::f8_e4m3:
    case TensorDType::u8:
      return 1;
  }
  return 1;
}

void check_holds_values(const WeightView& w) {
  XMOE_CHECK(w.dtype == TensorDType::f32 || w.dtype == TensorDType::f16 || w.dtype == TensorDType::bf16,
             "weight '", w.name, "': dtype ", tensor_dtype_name(w.dtype),
             " holds quantized codes, not values; it is read as a packed weight");
}

// Loads go through memcpy: safetensors data need not be aligned for the element type.
template <class T>
T load(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// IEEE binary16 → binary32, exact for every input: subnormals are renormalised, inf stays inf, NaN keeps
// its payload (shifted into the wider mantissa) and comes out quiet, as F16C hardware and torch convert it.
float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13) | (mant ? 0x00400000u : 0u);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {
    // value = mant × 2^-24; shift the leading 1 up to bit 10 (the implicit bit) and lower the exponent.
    const int shift = std::countl_zero(mant) - 21;  // mant < 2^10, so shift in [1, 10]
    mant = (mant << shift) & 0x3ffu;
    bits = sign | (static_cast<uint32_t>(113 - shift) << 23) | (mant << 13);
  }
  return std::bit_cast<float>(bits);
}

// Shard names come from the index; a name leaving the directory (absolute, "..") is refused rather than
// followed.
bool is_plain_relative(const std::string& name) {
  if (name.empty() || name[0] == '/') return false;
  size_t start = 0;
  while (start <= name.size()) {
    const size_t end = std::min(name.find('/', start), name.size());
    const std::string part = name.substr(start, end - start);
    if (part.empty() || part == "." || part == "..") return false;
    start = end + 1;
  }
  return true;
}

}  // namespace

int64_t WeightView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

void WeightView::to_f32(int64_t offset, int64_t count, float* out) const {
  XMOE_CHECK(offset >= 0 && count >= 0 && offset <= numel() - count, "weight '", name, "': elements [",
             offset, ", ", offset + count, ") are outside the tensor's ", numel());
  check_holds_values(*this);
  const std::byte* p = bytes.data() + static_cast<size_t>(offset) * element_size(dtype);
  switch (dtype) {
    case TensorDType::f32:
      if (count > 0) std::memcpy(out, p, static_cast<size_t>(count) * 4);
      break;
    case TensorDType::bf16:
      for (int64_t i = 0; i < count; ++i) out[i] = bf16::to_float(load<uint16_t>(p + 2 * i));
      break;
    case TensorDType::f16:
      for (int64_t i = 0; i < count; ++i) out[i] = f16_to_f32(load<uint16_t>(p + 2 * i));
      break;
    default:
      break;
  }
}

void WeightView::to_bf16(int64_t offset, int64_t count, uint16_t* out) const {
  XMOE_CHECK(offset >= 0 && count >= 0 && offset <= numel() - count, "weight '", name, "': elements [",
             offset, ", ", offset + count, ") are outside the tensor's ", numel());
  check_holds_values(*this);
  const std::byte* p = bytes.data() + static_cast<size_t>(offset) * element_size(dtype);
  switch (dtype) {
    case TensorDType::bf16:
      if (count > 0) std::memcpy(out, p, static_cast<size_t>(count) * 2);
      break;
    case TensorDType::f32:
      for (int64_t i = 0; i < count; ++i) out[i] = bf16::from_float(load<float>(p + 4 * i));
      break;
    case TensorDType::f16:
      // f16 → f32 is exact, so this rounds once.
      for (int64_t i = 0; i < count; ++i) out[i] = bf16::from_float(f16_to_f32(load<uint16_t>(p + 2 * i)));
      break;
    default:
      break;
  }
}

Checkpoint Checkpoint::open(const std::string& dir) {
  Checkpoint c;
  c.dir_ = dir;
  const std::string at = "checkpoint " + dir + ": ";
  struct stat st {};
  XMOE_CHECK(::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode), at, "not a directory");
  const std::string config_path = dir + "/config.json";
  XMOE_CHECK(is_regular_file(config_path), at, "config.json is missing");
  c.config_ = parse_model_config(config_path);
  c.quantization_ = parse_quantization_config(dir);

  // As transformers: a single model.safetensors wins over an index.
  const std::string single = dir + "/" + kSingleFile;
  const std::string index_path = dir + "/" + kIndexFile;
  std::map<std::string, size_t> where;  // tensor → file
  if (is_regular_file(single)) {
    c.files_.push_back(std::make_shared<SafetensorsFile>(SafetensorsFile::open(single)));
    for (const auto& e : c.files_[0]->entries()) where[e.name] = 0;
  } else {
    XMOE_CHECK(is_regular_file(index_path), at, "has neither ", kSingleFile, " nor ", kIndexFile);
    json index;
    try {
      index = json::parse(read_text_file(index_path));
    } catch (const json::parse_error& e) {
      throw Error(index_path + ": malformed JSON at byte " + std::to_string(e.byte) + ": " + e.what());
    } catch (const json::exception& e) {  // e.g. a number too large for a double (found by fuzzing)
      throw Error(index_path + ": malformed JSON: " + e.what());
    }
    XMOE_CHECK(index.is_object() && index.contains("weight_map"), index_path,
               ": field 'weight_map' is missing");
    const json& map = index["weight_map"];
    XMOE_CHECK(map.is_object() && !map.empty(), index_path,
               ": field 'weight_map' must be a non-empty object of tensor name → shard file");
    std::map<std::string, size_t> shard_ids;
    for (const auto& [tensor, file] : map.items()) {
      XMOE_CHECK(file.is_string(), index_path, ": weight_map['", tensor, "'] must be a file name, got ",
                 file.dump());
      const std::string shard = file.get<std::string>();
      XMOE_CHECK(is_plain_relative(shard), index_path, ": weight_map['", tensor, "'] = '", shard,
                 "' is not a file name inside the checkpoint directory");
      auto [it, inserted] = shard_ids.emplace(shard, c.files_.size());
      if (inserted) {
        const std::string path = dir + "/" + shard;
        XMOE_CHECK(is_regular_file(path), index_path, ": shard '", shard, "' (holding tensor '", tensor,
                   "') does not exist");
        c.files_.push_back(std::make_shared<SafetensorsFile>(SafetensorsFile::open(path)));
      }
      XMOE_CHECK(c.files_[it->second]->contains(tensor), index_path, ": tensor '", tensor,
                 "' is not in its shard '", shard, "'");
      where[tensor] = it->second;
    }
    // A tensor held by two shards is ambiguous even if the index names one of them: the checkpoint was
    // assembled wrongly. Tensors a shard holds that the index does not name are ignored, as transformers
    // loads only what the index maps.
    std::map<std::string, size_t> holder;
    for (size_t f = 0; f < c.files_.size(); ++f)
      for (const auto& e : c.files_[f]->entries()) {
        auto [it, inserted] = holder.emplace(e.name, f);
        XMOE_CHECK(inserted, at, "tensor '", e.name, "' is in two shards: ", c.files_[it->second]->path(),
                   " and ", c.files_[f]->path());
      }
  }
  c.index_.assign(where.begin(), where.end());  // std::map iterates sorted by name
  return c;
}

bool Checkpoint::contains(const std::string& name) const {
  auto it = std::lower_bound(index_.begin(), index_.end(), name,
                             [](const auto& entry, const std::string& n) { return entry.first < n; });
  return it != index_.end() && it->first == name;
}

WeightView Checkpoint::weight(const std::string& name, std::span<const int64_t> expected_shape) const {
  auto it = std::lower_bound(index_.begin(), index_.end(), name,
                             [](const auto& entry, const std::string& n) { return entry.first < n; });
  XMOE_CHECK(it != index_.end() && it->first == name, "checkpoint ", dir_, ": tensor '", name,
             "' is missing (", config_.architecture, " needs it)");
  const SafetensorsFile& file = *files_[it->second];
  const SafetensorsEntry& e = file.entry(name);
  WeightView w;
  w.name = name;
  XMOE_CHECK(dtype_of(e.dtype, w.dtype), "checkpoint ", dir_, ": tensor '", name, "' in ", file.path(),
             " has dtype ", e.dtype,
             ", not supported (supported: BF16, F16, F32, and F8_E4M3 and U8 in quantized "
             "checkpoints)");
  if (!expected_shape.empty()) {
    const bool same =
        std::equal(e.shape.begin(), e.shape.end(), expected_shape.begin(), expected_shape.end());
    XMOE_CHECK(same, "checkpoint ", dir_, ": tensor '", name, "' in ", file.path(), " has shape ",
               shape_str(e.shape), ", expected ", shape_str(expected_shape), " (", tensor_dtype_name(w.dtype),
               ")");
  }
  w.shape = e.shape;
  w.bytes = file.bytes(name);
  return w;
}

std::vector<std::string> Checkpoint::tensor_names() const {
  std::vector<std::string> names;
  names.reserve(index_.size());
  for (const auto& [name, _] : index_) names.push_back(name);
  return names;
}

Checkpoint::PrefaultResult Checkpoint::prefault(const ProgressFn& progress) const {
  // The tensors' byte ranges per file, merged where they touch: a few large madvise calls, not one per
  // tensor, and the gaps (tensors the index does not name) left alone.
  std::vector<std::vector<std::pair<size_t, size_t>>> ranges(files_.size());
  for (const auto& [name, file] : index_) {
    const SafetensorsEntry& e = files_[file]->entry(name);
    if (e.end > e.begin) ranges[file].emplace_back(e.begin, e.end);
  }
  constexpr size_t kChunk = size_t{256} << 20;
  const size_t total = total_bytes();
  PrefaultResult result;
  for (size_t f = 0; f < files_.size(); ++f) {
    std::vector<std::pair<size_t, size_t>>& r = ranges[f];
    std::sort(r.begin(), r.end());
    for (size_t i = 0; i < r.size();) {
      size_t begin = r[i].first, end = r[i].second;
      for (++i; i < r.size() && r[i].first <= end; ++i) end = std::max(end, r[i].second);
      for (size_t at = begin; at < end; at += kChunk) {
        const size_t stop = std::min(end, at + kChunk);
        result.error = files_[f]->prefault(at, stop);
        if (result.error != 0) {
          result.file = files_[f]->path();
          return result;
        }
        result.bytes += stop - at;
        if (progress) progress(std::min(result.bytes, total), total);
      }
    }
  }
  return result;
}

Checkpoint::HugePages Checkpoint::huge_pages() const {
  HugePages pages;
  const std::string smaps = io::self_smaps();
  for (const auto& file : files_) {
    pages.mapped += io::file_pmd_mapped(smaps, file->mapping());
    pages.mappable += io::huge_mappable_bytes(file->mapping());
  }
  return pages;
}

Checkpoint::PrefaultResult Checkpoint::drop_cached_pages() const {
  PrefaultResult result;
  for (const auto& file : files_) {
    result.error = io::drop_cached_pages(file->path(), file->mapping());
    if (result.error != 0) {
      result.file = file->path();
      return result;
    }
  }
  return result;
}

size_t Checkpoint::total_bytes() const {
  size_t total = 0;
  for (const auto& [name, file] : index_) {
    const SafetensorsEntry& e = files_[file]->entry(name);
    total += e.end - e.begin;
  }
  return total;
}

}  // namespace xmoe::llm
