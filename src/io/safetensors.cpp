#include "xmoe/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string_view>

#include "io/page_cache.hpp"
#include "xmoe/error.hpp"

namespace xmoe {

// The format is little-endian; views hand out the raw bytes, so a big-endian host would need a byte swap.
static_assert(std::endian::native == std::endian::little, "safetensors reader assumes a little-endian host");

namespace {

using json = nlohmann::json;

// The reference implementation refuses headers above 100 MB; a larger length is a corrupt or hostile file,
// and accepting it would make us parse (and allocate for) arbitrary amounts of data.
constexpr uint64_t kMaxHeaderSize = 100'000'000;

struct DTypeInfo {
  std::string_view name;
  unsigned bits;
};

// Every dtype the format defines, so files holding types we cannot compute on still open and expose bytes().
constexpr DTypeInfo kDTypes[] = {
    {"BOOL", 8},  {"U8", 8},      {"I8", 8},      {"U16", 16},    {"I16", 16}, {"F16", 16},
    {"BF16", 16}, {"I32", 32},    {"U32", 32},    {"F32", 32},    {"F64", 64}, {"I64", 64},
    {"U64", 64},  {"F8_E4M3", 8}, {"F8_E5M2", 8}, {"F8_E8M0", 8}, {"F4", 4},
};

const DTypeInfo* find_dtype(std::string_view name) {
  for (const auto& d : kDTypes)
    if (d.name == name) return &d;
  return nullptr;
}

std::string where(const std::string& path) {
  return "safetensors: " + path + ": ";
}

std::string where(const std::string& path, const std::string& tensor) {
  return "safetensors: " + path + ": tensor '" + tensor + "': ";
}

// A SAX pass that finds the first repeated key of the top-level object.
struct DuplicateTopLevelKey : json::json_sax_t {
  int depth = 0;
  std::set<std::string> seen;
  std::optional<std::string> duplicate;
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return ++depth, true; }
  bool end_object() override { return --depth, true; }
  bool start_array(std::size_t) override { return ++depth, true; }
  bool end_array() override { return --depth, true; }
  bool key(string_t& k) override {
    if (depth == 1 && !duplicate && !seen.insert(k).second) duplicate = k;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    return false;
  }
};

// JSON integers come back as unsigned, signed or float depending on their text; only a non-negative integer
// literal is a valid size or offset.
bool as_u64(const json& v, uint64_t& out) {
  if (!v.is_number_unsigned()) return false;
  out = v.get<uint64_t>();
  return true;
}

std::string joined_dtype_names() {
  std::string s;
  for (const auto& d : kDTypes) {
    if (!s.empty()) s += ", ";
    s += d.name;
  }
  return s;
}

SafetensorsEntry parse_entry(const std::string& path, const std::string& name, const json& v,
                             uint64_t data_size) {
  const std::string at = where(path, name);
  XMOE_CHECK(v.is_object(), at, "entry must be a JSON object, got ", v.type_name());
  for (const auto& [key, _] : v.items())
    XMOE_CHECK(key == "dtype" || key == "shape" || key == "data_offsets", at, "unexpected field '", key,
               "' (expected exactly dtype, shape, data_offsets)");
  for (const char* key : {"dtype", "shape", "data_offsets"})
    XMOE_CHECK(v.contains(key), at, "missing field '", key, "'");

  SafetensorsEntry e;
  e.name = name;

  const json& dt = v["dtype"];
  XMOE_CHECK(dt.is_string(), at, "field 'dtype' must be a string, got ", dt.type_name());
  e.dtype = dt.get<std::string>();
  const DTypeInfo* info = find_dtype(e.dtype);
  XMOE_CHECK(info != nullptr, at, "field 'dtype': unknown dtype '", e.dtype,
             "' (known: ", joined_dtype_names(), ")");

  const json& shape = v["shape"];
  XMOE_CHECK(shape.is_array(), at, "field 'shape' must be an array, got ", shape.type_name());
  uint64_t numel = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    uint64_t d = 0;
    XMOE_CHECK(as_u64(shape[i], d), at, "field 'shape': dim ", i, " must be a non-negative integer, got ",
               shape[i].dump());
    XMOE_CHECK(d <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), at, "field 'shape': dim ", i,
               " = ", d, " is too large");
    XMOE_CHECK(!__builtin_mul_overflow(numel, d, &numel) &&
                   numel <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
               at, "field 'shape': element count ", shape.dump(), " overflows");
    e.shape.push_back(static_cast<int64_t>(d));
  }
  uint64_t nbytes = 0;
  if (info->bits % 8 == 0) {
    XMOE_CHECK(!__builtin_mul_overflow(numel, uint64_t{info->bits / 8}, &nbytes), at,
               "field 'shape': ", shape.dump(), " of ", e.dtype, " overflows the byte size");
  } else {
    // Sub-byte types pack elements into bytes; a trailing half byte still occupies a whole one.
    nbytes = numel / 2 + numel % 2;
  }

  const json& off = v["data_offsets"];
  XMOE_CHECK(off.is_array() && off.size() == 2, at,
             "field 'data_offsets' must be an array [begin, end], got ", off.dump());
  uint64_t begin = 0, end = 0;
  XMOE_CHECK(as_u64(off[0], begin) && as_u64(off[1], end), at,
             "field 'data_offsets' must hold non-negative integers, got ", off.dump());
  XMOE_CHECK(begin <= end, at, "field 'data_offsets': begin ", begin, " > end ", end);
  XMOE_CHECK(end <= data_size, at, "field 'data_offsets': end ", end, " is beyond the data section (",
             data_size, " bytes)");
  XMOE_CHECK(end - begin == nbytes, at, "field 'data_offsets': range holds ", end - begin,
             " bytes but dtype ", e.dtype, " with shape ", shape.dump(), " needs ", nbytes);
  e.begin = static_cast<size_t>(begin);
  e.end = static_cast<size_t>(end);
  return e;
}

// Owns the descriptor only until the mapping exists; the mapping stays valid after close().
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

DType compute_dtype(const std::string& name, bool& ok) {
  ok = true;
  if (name == "F32") return DType::f32;
  if (name == "F64") return DType::f64;
  if (name == "BF16") return DType::bf16;
  ok = false;
  return DType::f32;
}

const char* file_dtype(DType t) {
  switch (t) {
    case DType::f32:
      return "F32";
    case DType::f64:
      return "F64";
    case DType::bf16:
      return "BF16";
  }
  return "?";
}

}  // namespace

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile f;
  f.path_ = path;
  const std::string at = where(path);

  Fd fd;
  fd.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  XMOE_CHECK(fd.fd >= 0, at, "cannot open: ", std::strerror(errno));
  struct stat st {};
  XMOE_CHECK(::fstat(fd.fd, &st) == 0, at, "cannot stat: ", std::strerror(errno));
  XMOE_CHECK(S_ISREG(st.st_mode), at, "not a regular file");
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  XMOE_CHECK(size >= 8, at, "file is ", size, " bytes, too short for the 8-byte header length");

  // Map rather than read: checkpoints can be far larger than RAM, and only touched pages are loaded.
  void* addr = ::mmap(nullptr, static_cast<size_t>(size), PROT_READ, MAP_PRIVATE, fd.fd, 0);
  XMOE_CHECK(addr != MAP_FAILED, at, "mmap of ", size, " bytes failed: ", std::strerror(errno));
  const size_t map_size = static_cast<size_t>(size);
  f.mapping_ = std::shared_ptr<void>(addr, [map_size](void* p) { ::munmap(p, map_size); });
  f.mapping_size_ = map_size;
  // Pages read from disk from now on are cached 2 MiB at a time where the kernel can (io/page_cache.hpp): a
  // weight stream then walks one page-table entry per 2 MiB instead of per 4 KiB. Refused without
  // transparent huge pages, which costs nothing.
  (void)io::advise_huge_pages(f.mapping());
  const auto* base = static_cast<const std::byte*>(addr);

  uint64_t n = 0;
  std::memcpy(&n, base, 8);
  XMOE_CHECK(n <= size - 8, at, "header length ", n, " is beyond the file (", size - 8,
             " bytes after the length field)");
  XMOE_CHECK(n <= kMaxHeaderSize, at, "header length ", n, " exceeds the limit of ", kMaxHeaderSize,
             " bytes");
  XMOE_CHECK(n >= 2, at, "header length ", n, " is too short for a JSON object");
  const char* hdr = reinterpret_cast<const char*>(base + 8);
  // The reference reader requires this too; it also stops a BOM or stray bytes from being skipped silently.
  XMOE_CHECK(hdr[0] == '{', at, "header must start with '{'");

  f.data_ = base + 8 + n;
  f.data_size_ = static_cast<size_t>(size - 8 - n);

  json header;
  try {
    header = json::parse(hdr, hdr + n);
  } catch (const json::exception& e) {
    throw Error(at + "header is not valid JSON (UTF-8): " + e.what());
  }
  XMOE_CHECK(header.is_object(), at, "header must be a JSON object, got ", header.type_name());
  // nlohmann keeps the last of duplicate keys; a repeated tensor name would silently shadow the first, so a
  // second (SAX) pass looks for one. Not a parser callback: with one, nlohmann scans the parent object for
  // discarded values at the end of every child, quadratic in the tensor count (seconds for an NVFP4 model's
  // four tensors per linear).
  DuplicateTopLevelKey finder;
  json::sax_parse(hdr, hdr + n, &finder);
  XMOE_CHECK(!finder.duplicate, at, "header: duplicate key '", finder.duplicate.value_or(""), "'");

  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      XMOE_CHECK(value.is_object(), at, "field '__metadata__' must be an object, got ", value.type_name());
      for (const auto& [key, mv] : value.items()) {
        XMOE_CHECK(mv.is_string(), at, "field '__metadata__': value of '", key, "' must be a string, got ",
                   mv.type_name());
        f.metadata_[key] = mv.get<std::string>();
      }
      continue;
    }
    f.entries_.push_back(parse_entry(path, name, value, f.data_size_));
  }

  std::sort(f.entries_.begin(), f.entries_.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    if (a.begin != b.begin) return a.begin < b.begin;
    if (a.end != b.end) return a.end < b.end;
    return a.name < b.name;
  });
  // Empty tensors share no bytes, so they may sit anywhere, even inside another tensor's range.
  const SafetensorsEntry* prev = nullptr;
  for (const auto& e : f.entries_) {
    if (e.begin == e.end) continue;
    XMOE_CHECK(prev == nullptr || e.begin >= prev->end, where(path, e.name), "field 'data_offsets': [",
               e.begin, ", ", e.end, ") overlaps tensor '", prev ? prev->name : "", "' at [",
               prev ? prev->begin : 0, ", ", prev ? prev->end : 0, ")");
    prev = &e;
  }
  for (size_t i = 0; i < f.entries_.size(); ++i) f.index_[f.entries_[i].name] = i;
  return f;
}

bool SafetensorsFile::contains(const std::string& name) const {
  return index_.count(name) != 0;
}

const SafetensorsEntry& SafetensorsFile::entry(const std::string& name) const {
  auto it = index_.find(name);
  XMOE_CHECK(it != index_.end(), where(path_, name), "no such tensor in the file (", entries_.size(),
             " tensors)");
  return entries_[it->second];
}

std::span<const std::byte> SafetensorsFile::bytes(const std::string& name) const {
  const SafetensorsEntry& e = entry(name);
  return {data_ + e.begin, e.end - e.begin};
}

int SafetensorsFile::prefault(size_t begin, size_t end) const {
  XMOE_CHECK(begin <= end && end <= data_size_, where(path_), "prefault range [", begin, ", ", end,
             ") is outside the data section (", data_size_, " bytes)");
  if (begin == end) return 0;
#ifdef MADV_POPULATE_READ
  // madvise takes page-aligned starts; the length may end anywhere (the kernel rounds it up).
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto first = reinterpret_cast<uintptr_t>(data_ + begin);
  const uintptr_t aligned = first - first % page;
  const size_t length = end - begin + (first - aligned);
  return ::madvise(reinterpret_cast<void*>(aligned), length, MADV_POPULATE_READ) == 0 ? 0 : errno;
#else
  return ENOSYS;
#endif
}

Tensor SafetensorsFile::tensor(const std::string& name) const {
  const SafetensorsEntry& e = entry(name);
  bool ok = false;
  const DType dt = compute_dtype(e.dtype, ok);
  XMOE_CHECK(ok, where(path_, name), "dtype ", e.dtype,
             " cannot be loaded as a Tensor (only F32, F64, BF16); use bytes() for the raw data");
  XMOE_CHECK(e.shape.size() <= static_cast<size_t>(kMaxDims), where(path_, name),
             "field 'shape': ", e.shape.size(), " dims, a Tensor holds at most ", kMaxDims);
  const Shape shape(std::span<const int64_t>(e.shape.data(), e.shape.size()));
  const std::byte* p = data_ + e.begin;
  // Writers such as MLX do not pad the header, so data can be misaligned; typed loads from it would be UB.
  if (reinterpret_cast<uintptr_t>(p) % dtype_size(dt) == 0) {
    // The mapping is read-only; the view is const in spirit, as the header's contract for tensor() says.
    return Tensor::wrap(const_cast<std::byte*>(p), shape, dt, mapping_);
  }
  Tensor t = Tensor::empty(shape, dt);
  if (e.end > e.begin) std::memcpy(t.raw(), p, e.end - e.begin);
  return t;
}

void save_safetensors_raw(const std::string& path, const std::vector<SafetensorsRawTensor>& tensors,
                          const std::map<std::string, std::string>& metadata) {
  const std::string at = where(path);
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json md = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) md[k] = v;
    header["__metadata__"] = std::move(md);
  }
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    XMOE_CHECK(t.name != "__metadata__", where(path, t.name), "the name is reserved for metadata");
    XMOE_CHECK(!header.contains(t.name), where(path, t.name), "duplicate tensor name");
    uint64_t nbytes = 0;
    for (const auto& piece : t.pieces) nbytes += piece.size();
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }

  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    throw Error(at + "cannot encode header (tensor names and metadata must be UTF-8): " + e.what());
  }
  // Padding with spaces keeps the JSON valid and puts the data section on an 8-byte boundary, so mapped
  // views of every supported dtype are aligned.
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');

  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    XMOE_CHECK(out.good(), at, "cannot create ", tmp, ": ", std::strerror(errno));
    unsigned char len[8];
    uint64_t n = text.size();
    std::memcpy(len, &n, 8);
    out.write(reinterpret_cast<const char*>(len), 8);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (const auto& t : tensors)
      for (const auto& piece : t.pieces)
        if (!piece.empty())
          out.write(reinterpret_cast<const char*>(piece.data()), static_cast<std::streamsize>(piece.size()));
    out.close();
    if (!out) {
      const int err = errno;
      std::remove(tmp.c_str());
      throw Error(at + "writing " + tmp + " failed: " + std::strerror(err));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    throw Error(at + "cannot rename " + tmp + " into place: " + std::strerror(err));
  }
}

void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsRawTensor> raw;
  raw.reserve(tensors.size());
  for (const auto& [name, t] : tensors) {
    XMOE_CHECK(t.defined(), where(path, name), "tensor is undefined");
    const auto dims = t.shape().dims();
    raw.push_back({name,
                   file_dtype(t.dtype()),
                   std::vector<int64_t>(dims.begin(), dims.end()),
                   {std::span<const std::byte>(static_cast<const std::byte*>(t.raw()), t.nbytes())}});
  }
  save_safetensors_raw(path, raw, metadata);
}

}  // namespace xmoe
