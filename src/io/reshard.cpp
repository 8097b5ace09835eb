#include "xmoe/reshard.hpp"

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string_view>

#include "xmoe/error.hpp"
#include "xmoe/safetensors.hpp"

namespace xmoe {

namespace {

using Dims = std::vector<int64_t>;

// Element sizes of the safetensors dtypes (the reader has already rejected unknown ones).
unsigned dtype_bits(const std::string& dtype) {
  static const std::map<std::string, unsigned, std::less<>> kBits = {
      {"BOOL", 8},  {"U8", 8},      {"I8", 8},      {"U16", 16},    {"I16", 16}, {"F16", 16},
      {"BF16", 16}, {"I32", 32},    {"U32", 32},    {"F32", 32},    {"F64", 64}, {"I64", 64},
      {"U64", 64},  {"F8_E4M3", 8}, {"F8_E5M2", 8}, {"F8_E8M0", 8}, {"F4", 4},
  };
  auto it = kBits.find(dtype);
  XMOE_CHECK(it != kBits.end(), "reshard: unknown dtype '", dtype, "'");
  return it->second;
}

std::string dims_str(std::span<const int64_t> d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(d[i]);
  }
  return s + "]";
}

int64_t product(std::span<const int64_t> d) {
  int64_t n = 1;
  for (int64_t x : d) n *= x;
  return n;
}

// Parses "[4, 8]" (as dims_str writes it); nullopt when malformed.
std::optional<Dims> parse_dims(const std::string& s) {
  if (s.size() < 2 || s.front() != '[' || s.back() != ']') return std::nullopt;
  Dims out;
  const std::string body = s.substr(1, s.size() - 2);
  if (body.find_first_not_of(' ') == std::string::npos) return out;
  size_t pos = 0;
  while (pos <= body.size()) {
    size_t comma = body.find(',', pos);
    if (comma == std::string::npos) comma = body.size();
    std::string item = body.substr(pos, comma - pos);
    const size_t b = item.find_first_not_of(' ');
    const size_t e = item.find_last_not_of(' ');
    if (b == std::string::npos) return std::nullopt;
    item = item.substr(b, e - b + 1);
    if (item.empty() || item.size() > 18 || item.find_first_not_of("0123456789") != std::string::npos)
      return std::nullopt;
    out.push_back(std::stoll(item));
    pos = comma + 1;
  }
  return out;
}

// A non-negative (or positive) decimal integer metadata value; nullopt when the key is absent.
std::optional<int64_t> meta_int(const SafetensorsFile& f, const char* key, const std::string& at,
                                bool positive) {
  auto it = f.metadata().find(key);
  if (it == f.metadata().end()) return std::nullopt;
  const std::string& v = it->second;
  const bool digits = !v.empty() && v.size() <= 12 && v.find_first_not_of("0123456789") == std::string::npos;
  const int64_t n = digits ? std::stoll(v) : -1;
  XMOE_CHECK(digits && (!positive || n > 0), at, "metadata '", key, "' = '", v, "' is not a ",
             positive ? "positive" : "non-negative", " integer");
  return n;
}

// Metadata kept from the source, less the per-rank keys the writer sets itself.
std::map<std::string, std::string> carried_metadata(const SafetensorsFile& f) {
  std::map<std::string, std::string> md;
  for (const auto& [k, v] : f.metadata()) {
    if (k == kMetaWorldSize || k == kMetaRank || k == kMetaNumGlobalExperts ||
        k.starts_with(kMetaExpertShapePrefix))
      continue;
    md[k] = v;
  }
  return md;
}

// The per-rank dims (after dim 0) of an expert whose dims after dim 0 are `inner`, sharded over d ranks:
// the first non-1 dim divided by d. Tutel requires every non-1 dim to be divisible by d.
Dims shard_inner(const Dims& inner, int64_t d, const std::string& at) {
  Dims s = inner;
  bool divided = false;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == 1) continue;
    XMOE_CHECK(s[i] % d == 0, at, "expert dims ", dims_str(inner), ": dim ", i + 1, " = ", s[i],
               " is not divisible by ", d, " (the ranks per expert); every non-1 dim must be");
    if (!divided) {
      s[i] /= d;
      divided = true;
    }
  }
  XMOE_CHECK(divided, at, "expert dims ", dims_str(inner), " hold one element, which cannot be split over ",
             d, " ranks");
  return s;
}

// Bytes of each of `pieces` equal parts of a tensor; they must be whole bytes.
size_t piece_bytes(const SafetensorsEntry& e, int64_t pieces, const std::string& at) {
  const int64_t numel = product(e.shape);
  const unsigned bits = dtype_bits(e.dtype);
  XMOE_CHECK(numel % pieces == 0, at, "shape ", dims_str(e.shape), " does not split into ", pieces,
             " equal pieces");
  const uint64_t piece_bits = static_cast<uint64_t>(numel / pieces) * bits;
  XMOE_CHECK(piece_bits % 8 == 0, at, "dtype ", e.dtype, ": a piece of ", numel / pieces,
             " elements is not a whole number of bytes");
  return static_cast<size_t>(piece_bits / 8);
}

using OutTensor = SafetensorsRawTensor;

// The dim (counted from the expert dim 0) an N % E == 0 shard of a tensor with per-expert dims `inner`
// splits: metadata `_expert_split_dim.<name>` when present, else Tutel's first non-1 dim.
size_t split_dim_of(const SafetensorsFile& f, const std::string& name, const Dims& inner,
                    const std::string& at) {
  auto it = f.metadata().find(kMetaExpertSplitDimPrefix + name);
  if (it == f.metadata().end()) {
    for (size_t i = 0; i < inner.size(); ++i)
      if (inner[i] != 1) return i + 1;
    return inner.size();
  }
  const std::string& v = it->second;
  const bool ok = v.size() == 1 && v[0] >= '1' && static_cast<size_t>(v[0] - '0') <= inner.size();
  XMOE_CHECK(ok, at, "metadata '", it->first, "' = '", v, "' is not a dim in [1, ", inner.size(),
             "] of the expert dims ", dims_str(inner));
  return static_cast<size_t>(v[0] - '0');
}

// Shard j of d of one expert, split along dim sd of the whole per-expert dims `whole`: `outer` runs of `run`
// bytes, run i at byte offset (i·d + j)·run of the expert.
struct Strides {
  int64_t outer = 1;
  size_t run = 0;
};
Strides shard_strides(const Dims& whole, size_t sd, int64_t d, unsigned bits, const std::string& at) {
  Strides s;
  int64_t run_elems = whole[sd - 1] / d;
  for (size_t i = 0; i + 1 < sd; ++i) s.outer *= whole[i];
  for (size_t i = sd; i < whole.size(); ++i) run_elems *= whole[i];
  XMOE_CHECK((static_cast<uint64_t>(run_elems) * bits) % 8 == 0, at, "a run of ", run_elems,
             " elements is not a whole number of bytes");
  s.run = static_cast<size_t>(static_cast<uint64_t>(run_elems) * bits / 8);
  return s;
}

// The per-expert dims of one of d shards split along dim sd; Tutel's default dim needs every non-1 dim
// divisible by d, an explicit one only itself.
Dims shard_dims(const Dims& inner, size_t sd, int64_t d, bool explicit_dim, const std::string& at) {
  if (!explicit_dim) return shard_inner(inner, d, at);
  XMOE_CHECK(inner[sd - 1] % d == 0, at, "expert dims ", dims_str(inner), ": dim ", sd, " = ", inner[sd - 1],
             " is not divisible by ", d, " (the ranks per expert)");
  Dims s = inner;
  s[sd - 1] /= d;
  return s;
}

// Any dtype from raw bytes; the output's directory is created first.
void write_raw(const std::string& path, const std::vector<OutTensor>& tensors,
               const std::map<std::string, std::string>& metadata) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(parent, ec);
    XMOE_CHECK(!ec, "reshard: ", path, ": cannot create directory ", parent.string(), ": ", ec.message());
  }
  save_safetensors_raw(path, tensors, metadata);
}

std::string tensor_at(const std::string& at, const std::string& name) {
  return at + "tensor '" + name + "': ";
}

}  // namespace

bool is_expert_tensor_name(const std::string& name) {
  return name.starts_with("experts.") || name.find(".experts.") != std::string::npos;
}

std::string expand_rank_pattern(const std::string& pattern, int rank, int size) {
  XMOE_CHECK(size >= 1, "reshard: pattern '", pattern, "': size must be positive, got ", size);
  XMOE_CHECK(rank >= 0 && rank < size, "reshard: pattern '", pattern, "': rank ", rank, " is outside [0, ",
             size, ")");
  XMOE_CHECK(size == 1 || pattern.find("{rank}") != std::string::npos, "reshard: pattern '", pattern,
             "' has no '{rank}', so all ", size, " ranks would share one file");
  std::string out;
  for (size_t i = 0; i < pattern.size();) {
    if (pattern.compare(i, 6, "{rank}") == 0) {
      out += std::to_string(rank);
      i += 6;
    } else if (pattern.compare(i, 6, "{size}") == 0) {
      out += std::to_string(size);
      i += 6;
    } else {
      out += pattern[i++];
    }
  }
  return out;
}

void reshard_gather(const std::vector<std::string>& inputs, const std::string& output) {
  XMOE_CHECK(!inputs.empty(), "reshard gather: no input files");
  const int64_t N = static_cast<int64_t>(inputs.size());
  std::vector<SafetensorsFile> files;
  std::vector<std::string> at;  // "reshard gather: rank r (path): "
  for (int64_t r = 0; r < N; ++r) {
    at.push_back("reshard gather: rank " + std::to_string(r) + " (" + inputs[r] + "): ");
    try {
      files.push_back(SafetensorsFile::open(inputs[r]));
    } catch (const Error& e) {
      throw Error("reshard gather: rank " + std::to_string(r) + " of " + std::to_string(N) + ": " + e.what());
    }
  }

  // Rank metadata, when present, must agree with the file's position in the list.
  std::optional<int64_t> E;
  for (int64_t r = 0; r < N; ++r) {
    if (auto ws = meta_int(files[r], kMetaWorldSize, at[r], true))
      XMOE_CHECK(*ws == N, at[r], "metadata '", kMetaWorldSize, "' = ", *ws, " but ", N, " files were given");
    if (auto rk = meta_int(files[r], kMetaRank, at[r], false))
      XMOE_CHECK(*rk == r, at[r], "metadata '", kMetaRank, "' = ", *rk, " but the file is input ", r);
    auto e = meta_int(files[r], kMetaNumGlobalExperts, at[r], true);
    if (r == 0) E = e;
    XMOE_CHECK(e.has_value() == E.has_value(), at[r], "metadata '", kMetaNumGlobalExperts, "' is ",
               e ? "present" : "absent", " but ", e ? "absent" : "present", " on rank 0 (", inputs[0], ")");
    if (e)
      XMOE_CHECK(*e == *E, at[r], "metadata '", kMetaNumGlobalExperts, "' = ", *e, " but rank 0 (", inputs[0],
                 ") has ", *E);
  }

  // Same tensor names and dtypes on every rank.
  const SafetensorsFile& first = files[0];
  for (int64_t r = 1; r < N; ++r) {
    for (const auto& e : first.entries()) {
      XMOE_CHECK(files[r].contains(e.name), tensor_at(at[r], e.name), "missing (rank 0 has it)");
      const auto& o = files[r].entry(e.name);
      XMOE_CHECK(o.dtype == e.dtype, tensor_at(at[r], e.name), "dtype ", o.dtype, " but rank 0 has ",
                 e.dtype);
    }
    for (const auto& o : files[r].entries())
      XMOE_CHECK(first.contains(o.name), tensor_at(at[r], o.name), "not on rank 0 (", inputs[0], ")");
  }

  // The local expert count L follows from E and N; without E metadata, E = N·L (the E % N == 0 layout).
  const SafetensorsEntry* first_expert = nullptr;
  for (const auto& e : first.entries())
    if (is_expert_tensor_name(e.name)) {
      XMOE_CHECK(!e.shape.empty(), tensor_at(at[0], e.name), "an expert tensor needs a leading expert dim");
      if (!first_expert) first_expert = &e;
    }
  if (!E && first_expert) E = N * first_expert->shape[0];
  int64_t L = 0, d = 1;
  if (E) {
    XMOE_CHECK(*E % N == 0 || N % *E == 0, "reshard gather: ", N, " ranks cannot hold ", *E,
               " experts: need E % N == 0 or N % E == 0");
    if (*E % N == 0) {
      L = *E / N;
    } else {
      L = 1;
      d = N / *E;
    }
  }

  const SafetensorsFile& last = files[N - 1];
  std::vector<OutTensor> out;
  for (const auto& e : first.entries()) {
    OutTensor t{e.name, e.dtype, {}, {}};
    if (is_expert_tensor_name(e.name)) {
      for (int64_t r = 0; r < N; ++r) {
        const auto& o = files[r].entry(e.name);
        XMOE_CHECK(!o.shape.empty() && o.shape[0] == L, tensor_at(at[r], e.name), "shape ", dims_str(o.shape),
                   ": expected ", L, " local experts in dim 0 (E = ", *E, ", N = ", N, ")");
        XMOE_CHECK(o.shape == e.shape, tensor_at(at[r], e.name), "shape ", dims_str(o.shape),
                   " but rank 0 has ", dims_str(e.shape));
        piece_bytes(o, 1, tensor_at(at[r], e.name));
      }
      const Dims inner(e.shape.begin() + 1, e.shape.end());
      Dims full = inner;
      if (d == 1) {
        for (int64_t r = 0; r < N; ++r) t.pieces.push_back(files[r].bytes(e.name));
      } else {
        const std::string tat = tensor_at(at[N - 1], e.name);
        XMOE_CHECK(!inner.empty(), tat, "shape ", dims_str(e.shape), " cannot be a shard of an expert over ",
                   d, " ranks");
        const bool explicit_dim = last.metadata().count(kMetaExpertSplitDimPrefix + e.name) > 0;
        auto it = last.metadata().find(kMetaExpertShapePrefix + e.name);
        if (it != last.metadata().end()) {
          auto parsed = parse_dims(it->second);
          XMOE_CHECK(parsed.has_value(), at[N - 1], "metadata '", it->first, "' = '", it->second,
                     "' is not a shape like [4, 8]");
          full = *parsed;
          XMOE_CHECK(full.size() == inner.size(), tat, "shard shape ", dims_str(e.shape),
                     " does not match the ", "expert dims ", dims_str(full), " recorded in metadata '",
                     it->first, "'");
        } else {
          // The recorded split dim, or (Tutel's layout) the whole's first non-1 dim, which is the shard's
          // too.
          full[split_dim_of(last, e.name, inner, tat) - 1] *= d;
        }
        const size_t sd = split_dim_of(last, e.name, full, tat);  // metadata, or the whole's first non-1 dim
        XMOE_CHECK(shard_dims(full, sd, d, explicit_dim, tat) == inner, tat, "shape ", dims_str(e.shape),
                   " is not a ", d, "-way shard (dim ", sd, " divided by ", d, ") of the expert dims ",
                   dims_str(full));
        // Expert x's runs interleave its d shards (files x·d .. x·d + d − 1).
        const Strides st = shard_strides(full, sd, d, dtype_bits(e.dtype), tat);
        for (int64_t x = 0; x < *E; ++x)
          for (int64_t o = 0; o < st.outer; ++o)
            for (int64_t j = 0; j < d; ++j)
              t.pieces.push_back(
                  files[x * d + j].bytes(e.name).subspan(static_cast<size_t>(o) * st.run, st.run));
      }
      t.shape.push_back(*E);
      t.shape.insert(t.shape.end(), full.begin(), full.end());
    } else {
      // Shared tensors: Tutel takes the last rank's; we also check that the ranks agree.
      const auto& ref = last.entry(e.name);
      const auto ref_bytes = last.bytes(e.name);
      for (int64_t r = 0; r < N - 1; ++r) {
        const auto& o = files[r].entry(e.name);
        XMOE_CHECK(o.shape == ref.shape, tensor_at(at[r], e.name), "shared tensor has shape ",
                   dims_str(o.shape), " but rank ", N - 1, " (", inputs[N - 1], ") has ",
                   dims_str(ref.shape));
        const auto b = files[r].bytes(e.name);
        XMOE_CHECK(b.size() == ref_bytes.size() &&
                       (b.empty() || std::memcmp(b.data(), ref_bytes.data(), b.size()) == 0),
                   tensor_at(at[r], e.name), "shared (non-expert) tensor differs from rank ", N - 1, " (",
                   inputs[N - 1], ")");
      }
      t.shape = ref.shape;
      t.pieces.push_back(ref_bytes);
    }
    out.push_back(std::move(t));
  }

  auto md = carried_metadata(last);
  if (E) md[kMetaNumGlobalExperts] = std::to_string(*E);
  md[kMetaWorldSize] = "1";
  md[kMetaRank] = "0";
  write_raw(output, out, md);
}

void reshard_scatter(const std::string& input, int output_size, const std::string& output_pattern) {
  XMOE_CHECK(output_size >= 1, "reshard scatter: output size must be positive, got ", output_size);
  const int64_t N = output_size;
  std::vector<std::string> paths;
  for (int r = 0; r < output_size; ++r) paths.push_back(expand_rank_pattern(output_pattern, r, output_size));

  SafetensorsFile f = [&] {
    try {
      return SafetensorsFile::open(input);
    } catch (const Error& e) {
      throw Error(std::string("reshard scatter: ") + e.what());
    }
  }();
  const std::string at = "reshard scatter: " + input + ": ";
  if (auto ws = meta_int(f, kMetaWorldSize, at, true))
    XMOE_CHECK(*ws == 1, at, "metadata '", kMetaWorldSize, "' = ", *ws,
               ": this is one rank's file; gather the ranks first");

  std::optional<int64_t> E = meta_int(f, kMetaNumGlobalExperts, at, true);
  for (const auto& e : f.entries()) {
    if (!is_expert_tensor_name(e.name)) continue;
    XMOE_CHECK(!e.shape.empty(), tensor_at(at, e.name), "an expert tensor needs a leading expert dim");
    if (!E) E = e.shape[0];
    XMOE_CHECK(e.shape[0] == *E, tensor_at(at, e.name), "shape ", dims_str(e.shape), ": dim 0 should be the ",
               *E, " global experts");
  }
  int64_t d = 1;
  if (E) {
    XMOE_CHECK(*E % N == 0 || N % *E == 0, "reshard scatter: cannot split ", *E, " experts over N = ", N,
               " ranks: need E % N == 0 or N % E == 0");
    if (*E % N != 0) d = N / *E;
  }

  struct Plan {
    const SafetensorsEntry* entry;
    Dims shape;        // per-rank shape
    size_t piece = 0;  // bytes per rank (expert tensors)
    Strides strides;   // N % E == 0: the runs of one shard within its expert
  };
  std::vector<Plan> plans;
  std::map<std::string, std::string> expert_shapes;
  for (const auto& e : f.entries()) {
    Plan p{&e, e.shape, 0, {}};
    if (is_expert_tensor_name(e.name)) {
      const std::string tat = tensor_at(at, e.name);
      const Dims inner(e.shape.begin() + 1, e.shape.end());
      if (d == 1) {
        p.shape[0] = *E / N;
      } else {
        const size_t sd = split_dim_of(f, e.name, inner, tat);
        const Dims s =
            shard_dims(inner, sd, d, f.metadata().count(kMetaExpertSplitDimPrefix + e.name) > 0, tat);
        p.shape.assign(1, 1);
        p.shape.insert(p.shape.end(), s.begin(), s.end());
        p.strides = shard_strides(inner, sd, d, dtype_bits(e.dtype), tat);
        expert_shapes[kMetaExpertShapePrefix + e.name] = dims_str(inner);
      }
      p.piece = piece_bytes(e, N, tat);
    }
    plans.push_back(std::move(p));
  }

  for (int64_t r = 0; r < N; ++r) {
    std::vector<OutTensor> out;
    for (const auto& p : plans) {
      const auto b = f.bytes(p.entry->name);
      OutTensor t{p.entry->name, p.entry->dtype, p.shape, {}};
      if (!is_expert_tensor_name(p.entry->name)) {
        t.pieces.push_back(b);
      } else if (d == 1) {
        t.pieces.push_back(b.subspan(static_cast<size_t>(r) * p.piece, p.piece));
      } else {
        const int64_t x = r / d, j = r % d;  // expert, shard
        const size_t expert_bytes = p.piece * static_cast<size_t>(d);
        for (int64_t o = 0; o < p.strides.outer; ++o)
          t.pieces.push_back(b.subspan(
              static_cast<size_t>(x) * expert_bytes + static_cast<size_t>(o * d + j) * p.strides.run,
              p.strides.run));
      }
      out.push_back(std::move(t));
    }
    auto md = carried_metadata(f);
    md.insert(expert_shapes.begin(), expert_shapes.end());
    if (E) md[kMetaNumGlobalExperts] = std::to_string(*E);
    md[kMetaWorldSize] = std::to_string(N);
    md[kMetaRank] = std::to_string(r);
    write_raw(paths[r], out, md);
  }
}

}  // namespace xmoe
