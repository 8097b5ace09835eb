// Checkpoint::open / weight() / WeightView conversions and the progress bar. Conversion expectations are bit
// patterns torch produced (tests/data/checkpoints/conversions.safetensors,
// tools/make_checkpoint_fixtures.py); bad checkpoints are made in a temporary directory and must fail with a
// message naming the file / tensor.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "llm/checkpoint.hpp"
#include "llm/progress_bar.hpp"
#include "xmoe/error.hpp"
#include "xmoe/safetensors.hpp"

namespace {

namespace fs = std::filesystem;
using xmoe::llm::Checkpoint;
using xmoe::llm::TensorDType;
using xmoe::llm::WeightView;

const std::string kData = std::string(XMOE_TEST_DATA_DIR) + "/checkpoints/";

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/xmoe_ckpt_XXXXXX";
    path_ = ::mkdtemp(tmpl);
  }
  ~TempDir() { fs::remove_all(path_); }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

void write_config(const TempDir& dir) {
  write_file(dir / "config.json", R"({"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
    "vocab_size": 16, "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
    "num_key_value_heads": 1, "num_experts": 2, "num_experts_per_tok": 1, "moe_intermediate_size": 4})");
}

// A tensor of F32 values 0, 1, 2, ... with the given shape.
struct OwnedTensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::vector<std::byte> bytes;
};

OwnedTensor f32_tensor(const std::string& name, std::vector<int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<float>(i);
  OwnedTensor t{name, "F32", std::move(shape), std::vector<std::byte>(v.size() * 4)};
  std::memcpy(t.bytes.data(), v.data(), t.bytes.size());
  return t;
}

void save(const std::string& path, const std::vector<OwnedTensor>& tensors) {
  std::vector<xmoe::SafetensorsRawTensor> raw;
  for (const auto& t : tensors)
    raw.push_back({t.name, t.dtype, t.shape, {std::span<const std::byte>(t.bytes)}});
  xmoe::save_safetensors_raw(path, raw);
}

// A safetensors file with a hand-written header and `data_bytes` zero bytes of data.
std::string raw_safetensors(const std::string& header, size_t data_bytes) {
  std::string s(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(s.data(), &n, 8);
  return s + header + std::string(data_bytes, '\0');
}

std::string open_error(const std::string& dir) {
  try {
    Checkpoint::open(dir);
  } catch (const xmoe::Error& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_HAS(msg, text) EXPECT_NE((msg).find(text), std::string::npos) << (msg)

// Two shards and their index: x [4] in a.safetensors (beside "extra" [1], which the index does not name) and
// y [2, 3] in b.safetensors, all F32.
void write_two_shards(const TempDir& dir) {
  write_config(dir);
  save(dir / "a.safetensors", {f32_tensor("x", {4}), f32_tensor("extra", {1})});
  save(dir / "b.safetensors", {f32_tensor("y", {2, 3})});
  write_file(
      dir / "model.safetensors.index.json",
      R"({"metadata": {"total_size": 40}, "weight_map": {"x": "a.safetensors", "y": "b.safetensors"}})");
}

TEST(Checkpoint, OpensSingleFile) {
  TempDir dir;
  write_config(dir);
  save(dir / "model.safetensors",
       {f32_tensor("model.embed_tokens.weight", {16, 8}), f32_tensor("model.norm.weight", {8})});
  const Checkpoint c = Checkpoint::open(dir.path());
  EXPECT_EQ(c.config().hidden_size, 8);
  EXPECT_EQ(c.dir(), dir.path());
  EXPECT_TRUE(c.contains("model.norm.weight"));
  EXPECT_FALSE(c.contains("lm_head.weight"));
  EXPECT_EQ(c.tensor_names(), (std::vector<std::string>{"model.embed_tokens.weight", "model.norm.weight"}));
  EXPECT_EQ(c.total_bytes(), (16 * 8 + 8) * 4u);
  const int64_t shape[] = {16, 8};
  const WeightView w = c.weight("model.embed_tokens.weight", shape);
  EXPECT_EQ(w.dtype, TensorDType::f32);
  EXPECT_EQ(w.numel(), 128);
  float out[3];
  w.to_f32(125, 3, out);
  EXPECT_EQ(out[0], 125.0f);
  EXPECT_EQ(out[2], 127.0f);
  uint16_t b[2];
  w.to_bf16(1, 2, b);
  EXPECT_EQ(b[0], 0x3f80);  // 1.0
  EXPECT_EQ(b[1], 0x4000);  // 2.0
}

TEST(Checkpoint, WeightErrorsNameTensor) {
  TempDir dir;
  write_config(dir);
  OwnedTensor ints{"model.layers.0.mlp.gate.weight", "I32", {2}, std::vector<std::byte>(8)};
  save(dir / "model.safetensors", {f32_tensor("model.norm.weight", {8}), ints});
  const Checkpoint c = Checkpoint::open(dir.path());
  auto error_of = [&](const std::string& name, std::vector<int64_t> shape) -> std::string {
    try {
      c.weight(name, shape);
    } catch (const xmoe::Error& e) {
      return e.what();
    }
    return "";
  };
  std::string msg = error_of("lm_head.weight", {});
  EXPECT_HAS(msg, "tensor 'lm_head.weight' is missing");
  EXPECT_HAS(msg, dir.path());
  msg = error_of("model.norm.weight", {16});
  EXPECT_HAS(msg, "tensor 'model.norm.weight'");
  EXPECT_HAS(msg, "has shape [8], expected [16]");
  msg = error_of("model.norm.weight", {8, 1});
  EXPECT_HAS(msg, "expected [8, 1]");
  msg = error_of("model.layers.0.mlp.gate.weight", {});
  EXPECT_HAS(msg, "tensor 'model.layers.0.mlp.gate.weight'");
  EXPECT_HAS(msg, "dtype I32, not supported");
  EXPECT_EQ(error_of("model.norm.weight", {8}), "");

  const WeightView w = c.weight("model.norm.weight");
  float out[8];
  try {
    w.to_f32(4, 5, out);
    FAIL() << "out-of-range conversion accepted";
  } catch (const xmoe::Error& e) {
    EXPECT_HAS(std::string(e.what()), "weight 'model.norm.weight'");
  }
  EXPECT_THROW(w.to_f32(-1, 1, out), xmoe::Error);
  uint16_t b[1];
  EXPECT_THROW(w.to_bf16(8, 1, b), xmoe::Error);
}

TEST(Checkpoint, ConversionsMatchTorch) {
  // conversions.safetensors holds F16/F32/BF16 inputs and torch's results as I64 bit patterns.
  const xmoe::SafetensorsFile f = xmoe::SafetensorsFile::open(kData + "conversions.safetensors");
  auto view = [&](const std::string& name, TensorDType fmt) {
    const auto& e = f.entry(name);
    return WeightView{name, fmt, e.shape, f.bytes(name)};
  };
  auto expected = [&](const std::string& name) {
    const auto bytes = f.bytes(name);
    std::vector<int64_t> v(bytes.size() / 8);
    std::memcpy(v.data(), bytes.data(), bytes.size());
    return v;
  };
  auto f32_bits = [](const std::vector<float>& v) {
    std::vector<int64_t> bits;
    for (float x : v) {
      uint32_t u;
      std::memcpy(&u, &x, 4);
      bits.push_back(u);
    }
    return bits;
  };
  auto convert_f32 = [](const WeightView& w) {
    std::vector<float> out(static_cast<size_t>(w.numel()));
    w.to_f32(0, w.numel(), out.data());
    return out;
  };
  auto convert_bf16 = [](const WeightView& w) {
    std::vector<uint16_t> out(static_cast<size_t>(w.numel()));
    w.to_bf16(0, w.numel(), out.data());
    return std::vector<int64_t>(out.begin(), out.end());
  };
  ASSERT_EQ(f.entry("f16").dtype, "F16");
  ASSERT_EQ(f.entry("bf16").dtype, "BF16");
  const WeightView f16 = view("f16", TensorDType::f16);
  const WeightView f32 = view("f32", TensorDType::f32);
  const WeightView bf16 = view("bf16", TensorDType::bf16);
  // Subnormals, infinities and NaN payloads included: exact bit equality.
  EXPECT_EQ(f32_bits(convert_f32(f16)), expected("expected.f16_as_f32"));
  // Which NaN bf16 rounding gives is the implementation's choice (torch's vectorised path writes 0xffff, its
  // scalar one 0x7fc0): NaN must stay NaN, every other value must match bit for bit.
  auto bf16_nan_agnostic = [](std::vector<int64_t> bits) {
    for (auto& b : bits)
      if ((b & 0x7f80) == 0x7f80 && (b & 0x7f) != 0) b = 0x7fc0;
    return bits;
  };
  EXPECT_EQ(bf16_nan_agnostic(convert_bf16(f16)), bf16_nan_agnostic(expected("expected.f16_as_bf16")));
  EXPECT_EQ(bf16_nan_agnostic(convert_bf16(f32)), bf16_nan_agnostic(expected("expected.f32_as_bf16")));
  EXPECT_EQ(f32_bits(convert_f32(bf16)), expected("expected.bf16_as_f32"));
  EXPECT_EQ(f32_bits(convert_f32(f32)), f32_bits([&] {
              std::vector<float> v(static_cast<size_t>(f32.numel()));
              std::memcpy(v.data(), f32.bytes.data(), f32.bytes.size());
              return v;
            }()));
  std::vector<uint16_t> bits(static_cast<size_t>(bf16.numel()));
  bf16.to_bf16(0, bf16.numel(), bits.data());
  EXPECT_EQ(0, std::memcmp(bits.data(), bf16.bytes.data(), bf16.bytes.size()));

  // A sub-range converts the same elements as the whole.
  const std::vector<int64_t> all = expected("expected.f16_as_f32");
  float part[7];
  f16.to_f32(11, 7, part);
  EXPECT_EQ(f32_bits(std::vector<float>(part, part + 7)),
            std::vector<int64_t>(all.begin() + 11, all.begin() + 18));
}

TEST(Checkpoint, UnalignedDataConverts) {
  // A 1-byte tensor first puts the F32 and BF16 data at odd offsets: loads must not assume alignment.
  TempDir dir;
  write_config(dir);
  OwnedTensor pad{"pad", "U8", {1}, {std::byte{7}}};
  OwnedTensor h{"half", "F16", {3}, std::vector<std::byte>(6)};
  const uint16_t h_bits[3] = {0x3c00, 0x0001, 0xfc00};  // 1, 2^-24, -inf
  std::memcpy(h.bytes.data(), h_bits, 6);
  save(dir / "model.safetensors", {pad, f32_tensor("odd", {5}), h});
  const Checkpoint c = Checkpoint::open(dir.path());
  float out[5];
  c.weight("odd").to_f32(0, 5, out);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(out[i], static_cast<float>(i));
  c.weight("half").to_f32(0, 3, out);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], std::ldexp(1.0f, -24));
  EXPECT_TRUE(std::isinf(out[2]) && out[2] < 0);
}

TEST(Checkpoint, OpensShardsFromIndex) {
  TempDir dir;
  write_two_shards(dir);
  const Checkpoint c = Checkpoint::open(dir.path());
  EXPECT_EQ(c.tensor_names(), (std::vector<std::string>{"x", "y"}));
  // Tensors a shard holds but the index does not name are ignored.
  EXPECT_FALSE(c.contains("extra"));
  EXPECT_EQ(c.total_bytes(), 40u);
  float out[6];
  c.weight("y").to_f32(0, 6, out);
  EXPECT_EQ(out[5], 5.0f);
}

TEST(Checkpoint, PrefaultCoversEveryIndexedTensorWithProgress) {
  TempDir dir;
  write_two_shards(dir);
  const Checkpoint c = Checkpoint::open(dir.path());
  std::vector<std::pair<size_t, size_t>> calls;
  const Checkpoint::PrefaultResult r =
      c.prefault([&](size_t done, size_t total) { calls.emplace_back(done, total); });
  if (r.error == EINVAL || r.error == ENOSYS) GTEST_SKIP() << "no MADV_POPULATE_READ on this kernel";
  ASSERT_EQ(r.error, 0) << r.file << ": " << std::strerror(r.error);
  // The shard's unindexed "extra" is not counted: 16 bytes of x and 24 of y.
  EXPECT_EQ(r.bytes, 40u);
  ASSERT_FALSE(calls.empty());
  EXPECT_EQ(calls.back(), std::make_pair(size_t{40}, size_t{40}));
  for (size_t i = 1; i < calls.size(); ++i) EXPECT_GE(calls[i].first, calls[i - 1].first);
}

TEST(Checkpoint, BadIndexNamesWhatIsWrong) {
  TempDir dir;
  write_config(dir);
  save(dir / "a.safetensors", {f32_tensor("x", {4})});
  save(dir / "b.safetensors", {f32_tensor("y", {2}), f32_tensor("x", {1})});
  const std::string index = dir / "model.safetensors.index.json";

  write_file(index, R"({"weight_map": {"x": "a.safetensors", "z": "missing.safetensors"}})");
  std::string msg = open_error(dir.path());
  EXPECT_HAS(msg, "shard 'missing.safetensors'");
  EXPECT_HAS(msg, "does not exist");
  EXPECT_HAS(msg, "model.safetensors.index.json");

  write_file(index, R"({"weight_map": {"x": "a.safetensors", "q": "a.safetensors"}})");
  msg = open_error(dir.path());
  EXPECT_HAS(msg, "tensor 'q' is not in its shard 'a.safetensors'");

  write_file(index, R"({"weight_map": {"x": "a.safetensors", "y": "b.safetensors"}})");
  msg = open_error(dir.path());
  EXPECT_HAS(msg, "tensor 'x' is in two shards");

  write_file(index, R"({"weight_map": {"x": "../a.safetensors"}})");
  EXPECT_HAS(open_error(dir.path()), "not a file name inside the checkpoint directory");
  write_file(index, R"({"weight_map": {"x": 3}})");
  EXPECT_HAS(open_error(dir.path()), "weight_map['x'] must be a file name");
  write_file(index, R"({"metadata": {}})");
  EXPECT_HAS(open_error(dir.path()), "field 'weight_map' is missing");
  write_file(index, R"({"weight_map": {"x": "a.safetensors",)");
  msg = open_error(dir.path());
  EXPECT_HAS(msg, "model.safetensors.index.json: malformed JSON at byte");
  // Found by tests/fuzz (checkpoint_index): a number too large for a double escaped as a json::out_of_range.
  write_file(index, R"({"metadata": {"total_size": 1e999}, "weight_map": {"x": "a.safetensors"}})");
  msg = open_error(dir.path());
  EXPECT_HAS(msg, "model.safetensors.index.json: malformed JSON");
  EXPECT_HAS(msg, "1e999");
}

// The same in the quantization config reader (found by tests/fuzz, quantization_config).
TEST(Checkpoint, QuantizationConfigNumberOutOfRangeIsNamed) {
  TempDir dir;
  write_file(dir / "config.json", R"({"quantization_config": {"quant_method": "fp8", "x": -1e400}})");
  std::string msg = "<no error>";
  try {
    xmoe::llm::parse_quantization_config(dir.path());
  } catch (const xmoe::Error& e) {
    msg = e.what();
  }
  EXPECT_HAS(msg, "config.json: malformed JSON");
}

TEST(Checkpoint, MissingFilesNamed) {
  TempDir dir;
  EXPECT_HAS(open_error(dir.path()), "config.json is missing");
  EXPECT_HAS(open_error(dir / "nope"), "not a directory");
  write_config(dir);
  std::string msg = open_error(dir.path());
  EXPECT_HAS(msg, "has neither model.safetensors nor model.safetensors.index.json");
  write_file(dir / "config.json", R"({"architectures": ["MixtralForCausalLM"]})");
  msg = open_error(dir.path());
  EXPECT_HAS(msg, "config.json");
  EXPECT_HAS(msg, "unknown architecture 'MixtralForCausalLM'");
}

TEST(Checkpoint, CorruptSafetensorsNamesFile) {
  TempDir dir;
  write_config(dir);
  const std::string file = dir / "model.safetensors";
  struct Case {
    std::string bytes;
    const char* says;
  };
  const std::string good_header = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  const Case cases[] = {
      {std::string(5, '\0'), "too short for the 8-byte header length"},
      // Truncated: the header promises more bytes than the file holds.
      {raw_safetensors(good_header, 8).substr(0, 20), "is beyond the file"},
      // Data cut short: the offsets point past the end of the data.
      {raw_safetensors(good_header, 4), "is beyond the data section"},
      {raw_safetensors(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,99999]}})", 8),
       "is beyond the data section"},
      // dtype × shape disagrees with the byte range.
      {raw_safetensors(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8), "needs 12"},
      {raw_safetensors(R"({"w":{"dtype":"BF16","shape":[2],"data_offsets":[0,8]}})", 8), "needs 4"},
      {raw_safetensors(R"({"w":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}})", 8),
       "unknown dtype 'F33'"},
      {raw_safetensors(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},
                           "v":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                       8),
       "overlaps"},
      {raw_safetensors(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})", 8), "not valid JSON"},
  };
  for (const auto& c : cases) {
    write_file(file, c.bytes);
    const std::string msg = open_error(dir.path());
    SCOPED_TRACE(c.says);
    EXPECT_HAS(msg, file);
    EXPECT_HAS(msg, c.says);
  }
  write_file(file, raw_safetensors(good_header, 8));
  EXPECT_EQ(open_error(dir.path()), "");
}

// Every prefix of a valid file and every single-byte corruption of its header is either still a valid
// checkpoint or an xmoe::Error: never a crash or another exception type.
TEST(Checkpoint, TruncatedAndCorruptedFilesOnlyThrowXmoeError) {
  TempDir dir;
  write_config(dir);
  const std::string file = dir / "model.safetensors";
  save(file, {f32_tensor("a", {3}), f32_tensor("b", {2, 2})});
  const std::string good = [&] {
    std::ifstream in(file, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  auto outcome = [&](const std::string& bytes) {
    write_file(file, bytes);
    try {
      const Checkpoint c = Checkpoint::open(dir.path());
      for (const auto& name : c.tensor_names()) {
        const WeightView w = c.weight(name);
        std::vector<float> v(static_cast<size_t>(w.numel()));
        w.to_f32(0, w.numel(), v.data());
      }
      return 0;
    } catch (const xmoe::Error&) {
      return 1;
    }
  };
  for (size_t n = 0; n < good.size(); ++n) EXPECT_EQ(outcome(good.substr(0, n)), 1) << "prefix " << n;
  uint64_t header_len = 0;
  std::memcpy(&header_len, good.data(), 8);
  const char replacements[] = {'\0', '"', '}', '9', '-', 'x', ' ', '\xff'};
  for (size_t i = 0; i < 8 + header_len; ++i)
    for (char r : replacements) {
      std::string bad = good;
      bad[i] = r;
      EXPECT_NO_FATAL_FAILURE(outcome(bad));
    }
  EXPECT_EQ(outcome(good), 0);

  // config.json cut anywhere: an error naming config.json.
  write_file(file, good);
  const std::string config = [&] {
    std::ifstream in(dir / "config.json", std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  for (size_t n = 0; n < config.size(); ++n) {
    write_file(dir / "config.json", config.substr(0, n));
    const std::string msg = open_error(dir.path());
    EXPECT_NE(msg.find("config.json"), std::string::npos) << n << ": " << msg;
  }
}

TEST(ProgressBar, TerminalRedrawsInPlace) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  {
    xmoe::llm::ProgressBar bar("loading", f, xmoe::llm::ProgressBar::Style::terminal);
    const xmoe::llm::ProgressFn fn = bar.callback();
    fn(0, 2'000'000'000);
    fn(1'000'000'000, 2'000'000'000);
    fn(2'000'000'000, 2'000'000'000);
  }  // destructor finishes the line
  std::rewind(f);
  std::string text(4096, '\0');
  text.resize(std::fread(text.data(), 1, text.size(), f));
  std::fclose(f);
  EXPECT_HAS(text, "\rloading [");
  EXPECT_HAS(text, "  0.0%");
  EXPECT_HAS(text, "100.0% 2.00/2.00 GB");
  EXPECT_HAS(text, "[##############################]");
  EXPECT_EQ(text.back(), '\n');
}

TEST(ProgressBar, NonTerminalPrintsOneSummaryLine) {
  std::FILE* f = std::tmpfile();  // not a TTY: automatic style must choose the summary
  ASSERT_NE(f, nullptr);
  {
    xmoe::llm::ProgressBar bar("loading", f);
    for (size_t i = 0; i <= 10; ++i) bar.update(i * 100'000'000, 1'000'000'000);
    bar.finish();
    bar.finish();  // once only
  }
  std::rewind(f);
  std::string text(4096, '\0');
  text.resize(std::fread(text.data(), 1, text.size(), f));
  std::fclose(f);
  EXPECT_EQ(text.find('\r'), std::string::npos) << text;
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 1) << text;
  EXPECT_HAS(text, "loading: 1.00 GB in ");
}

}  // namespace
