#include "xmoe/safetensors.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

namespace fs = std::filesystem;
using xmoe::bf16;
using xmoe::DType;
using xmoe::SafetensorsFile;
using xmoe::Shape;
using xmoe::Tensor;

namespace {

Tensor iota(const Shape& shape, DType dtype, double start, double step) {
  Tensor t = Tensor::empty(shape, dtype);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, start + step * static_cast<double>(i));
  return t;
}

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_all(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << p;
}

std::string le64(uint64_t n) {
  std::string s(8, '\0');
  std::memcpy(s.data(), &n, 8);
  return s;
}

// A file image with the given header text and `data_size` bytes of data (0, 1, 2, ... mod 256).
std::string image(const std::string& header, size_t data_size) {
  std::string s = le64(header.size()) + header;
  for (size_t i = 0; i < data_size; ++i) s.push_back(static_cast<char>(i & 0xff));
  return s;
}

// Each test works in its own directory so parallel ctest runs and reruns never see each other's files.
class Safetensors : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::path(::testing::TempDir()) /
           ("xmoe_st_" + std::to_string(::getpid()) + "_" + info->test_suite_name() + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  std::string file(const std::string& name) const { return (dir_ / name).string(); }

  std::string write(const std::string& name, const std::string& bytes) {
    std::string p = file(name);
    write_all(p, bytes);
    return p;
  }

  // Opening `bytes` must fail with an xmoe::Error naming the file and every fragment in `expected`.
  void expect_open_error(const std::string& name, const std::string& bytes,
                         std::initializer_list<std::string> expected) {
    std::string p = write(name, bytes);
    try {
      SafetensorsFile::open(p);
      ADD_FAILURE() << name << ": open succeeded, expected an error";
    } catch (const xmoe::Error& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find(p), std::string::npos) << "message lacks the path: " << msg;
      for (const auto& frag : expected)
        EXPECT_NE(msg.find(frag), std::string::npos) << "message lacks '" << frag << "': " << msg;
    }
  }

  fs::path dir_;
};

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const xmoe::Error& e) {
    return e.what();
  }
  return "<no error>";
}

TEST_F(Safetensors, RoundTripDtypesMetadataScalarAndEmpty) {
  const std::string p = file("round.safetensors");
  std::vector<std::pair<std::string, Tensor>> tensors = {
      {"b.weight", iota({2, 3}, DType::bf16, -1.0, 0.5)},  // 12 bytes: later tensors start unaligned to 8
      {"a.f32", iota({3}, DType::f32, 0.25, 1.5)},        {"z.f64", iota({2, 2}, DType::f64, 1e-300, 3.0)},
      {"scalar", iota({}, DType::f32, 7.5, 0.0)},         {"empty", Tensor::empty({0, 5}, DType::bf16)},
      {"empty_f64", Tensor::empty({4, 0}, DType::f64)},
  };
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"note", "h\u00e9llo \"quoted\""}};
  xmoe::save_safetensors(p, tensors, meta);
  EXPECT_FALSE(fs::exists(p + ".tmp"));

  const std::string raw = read_all(p);
  uint64_t n = 0;
  std::memcpy(&n, raw.data(), 8);
  EXPECT_EQ((8 + n) % 8, 0u) << "data section must start 8-byte aligned";
  EXPECT_EQ(raw[8], '{');

  SafetensorsFile f = SafetensorsFile::open(p);
  EXPECT_EQ(f.path(), p);
  EXPECT_EQ(f.metadata(), meta);
  ASSERT_EQ(f.entries().size(), tensors.size());
  // Written in the given order, so the offset order equals it.
  for (size_t i = 0; i < tensors.size(); ++i) EXPECT_EQ(f.entries()[i].name, tensors[i].first);
  for (size_t i = 1; i < f.entries().size(); ++i) EXPECT_EQ(f.entries()[i].begin, f.entries()[i - 1].end);

  EXPECT_EQ(f.entry("b.weight").dtype, "BF16");
  EXPECT_EQ(f.entry("a.f32").dtype, "F32");
  EXPECT_EQ(f.entry("z.f64").dtype, "F64");
  EXPECT_EQ(f.entry("scalar").shape, std::vector<int64_t>{});
  EXPECT_EQ(f.entry("empty").shape, (std::vector<int64_t>{0, 5}));

  for (const auto& [name, src] : tensors) {
    ASSERT_TRUE(f.contains(name));
    Tensor t = f.tensor(name);
    EXPECT_EQ(t.dtype(), src.dtype()) << name;
    EXPECT_EQ(t.shape(), src.shape()) << name;
    EXPECT_EQ(f.bytes(name).size(), src.nbytes()) << name;
    for (int64_t i = 0; i < t.numel(); ++i) EXPECT_EQ(t.get(i), src.get(i)) << name << "[" << i << "]";
  }
  EXPECT_FALSE(f.contains("missing"));
}

TEST_F(Safetensors, AlignedTensorIsAViewThatOutlivesTheFile) {
  const std::string p = file("view.safetensors");
  xmoe::save_safetensors(p, {{"w", iota({4, 4}, DType::f32, 1.0, 1.0)}});
  Tensor t;
  {
    SafetensorsFile f = SafetensorsFile::open(p);
    t = f.tensor("w");
    EXPECT_EQ(t.raw(), static_cast<const void*>(f.bytes("w").data())) << "aligned data should not be copied";
  }
  // The file object is gone; the view keeps the mapping alive (ASan would flag a use after munmap).
  fs::remove(p);
  for (int64_t i = 0; i < 16; ++i) EXPECT_EQ(t.get(i), 1.0 + static_cast<double>(i));
}

TEST_F(Safetensors, UnalignedDataIsCopied) {
  // MLX-style: no header padding, so the data section starts at an odd address.
  const std::string header = R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"("y":{"dtype":"F64","shape":[1],"data_offsets":[8,16]},)"
                             R"("z":{"dtype":"BF16","shape":[1],"data_offsets":[16,18]}})";
  std::string bytes = le64(header.size() + 1) + header + " ";
  ASSERT_NE((8 + header.size() + 1) % 2, 0u) << "fixture must be unaligned";
  const float x[2] = {1.25f, -3.5f};
  const double y = 6.125;
  const uint16_t z = bf16::from_float(-0.75f);
  bytes.append(reinterpret_cast<const char*>(x), 8);
  bytes.append(reinterpret_cast<const char*>(&y), 8);
  bytes.append(reinterpret_cast<const char*>(&z), 2);
  const std::string p = write("mlx.safetensors", bytes);

  SafetensorsFile f = SafetensorsFile::open(p);
  Tensor tx = f.tensor("x"), ty = f.tensor("y"), tz = f.tensor("z");
  EXPECT_NE(tx.raw(), static_cast<const void*>(f.bytes("x").data()));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(tx.raw()) % 4, 0u);
  EXPECT_EQ(tx.get(0), 1.25);
  EXPECT_EQ(tx.get(1), -3.5);
  EXPECT_EQ(ty.get(0), 6.125);
  EXPECT_EQ(tz.get(0), -0.75);
}

TEST_F(Safetensors, ReadsFileWrittenByPythonSafetensors) {
  const fs::path dir = fs::path(XMOE_TEST_DATA_DIR) / "safetensors";
  const std::string p = (dir / "reference.safetensors").string();
  std::ifstream js(dir / "reference.json");
  ASSERT_TRUE(js.good()) << "missing " << (dir / "reference.json");
  const nlohmann::json expected = nlohmann::json::parse(js);

  SafetensorsFile f = SafetensorsFile::open(p);
  EXPECT_EQ(f.metadata(), (expected["metadata"].get<std::map<std::string, std::string>>()));
  ASSERT_EQ(f.entries().size(), expected["tensors"].size());
  for (size_t i = 1; i < f.entries().size(); ++i) EXPECT_LE(f.entries()[i - 1].begin, f.entries()[i].begin);

  for (const auto& ex : expected["tensors"]) {
    const std::string name = ex["name"];
    SCOPED_TRACE(name);
    const auto& e = f.entry(name);
    EXPECT_EQ(e.dtype, ex["dtype"].get<std::string>());
    EXPECT_EQ(e.shape, ex["shape"].get<std::vector<int64_t>>());
    const auto& values = ex["values"];
    const auto raw = f.bytes(name);
    if (e.dtype == "F32" || e.dtype == "F64" || e.dtype == "BF16") {
      Tensor t = f.tensor(name);
      ASSERT_EQ(static_cast<size_t>(t.numel()), values.size());
      for (size_t i = 0; i < values.size(); ++i)
        EXPECT_EQ(t.get(static_cast<int64_t>(i)), values[i].get<double>()) << "[" << i << "]";
    } else if (e.dtype == "I64") {
      ASSERT_EQ(raw.size(), values.size() * 8);
      for (size_t i = 0; i < values.size(); ++i) {
        int64_t v = 0;
        std::memcpy(&v, raw.data() + 8 * i, 8);
        EXPECT_EQ(v, values[i].get<int64_t>()) << "[" << i << "]";
      }
    } else if (e.dtype == "U8") {
      ASSERT_EQ(raw.size(), values.size());
      for (size_t i = 0; i < values.size(); ++i)
        EXPECT_EQ(static_cast<unsigned>(raw[i]), values[i].get<unsigned>()) << "[" << i << "]";
    } else {
      ADD_FAILURE() << "fixture dtype " << e.dtype << " not covered by the test";
    }
  }
}

TEST_F(Safetensors, AcceptsEveryFormatDtype) {
  struct D {
    const char* name;
    size_t bytes_for_3;
  };
  const D dtypes[] = {{"BOOL", 3}, {"U8", 3},      {"I8", 3},      {"U16", 6},     {"I16", 6},  {"F16", 6},
                      {"BF16", 6}, {"I32", 12},    {"U32", 12},    {"F32", 12},    {"F64", 24}, {"I64", 24},
                      {"U64", 24}, {"F8_E4M3", 3}, {"F8_E5M2", 3}, {"F8_E8M0", 3}, {"F4", 2}};
  nlohmann::json h = nlohmann::json::object();
  size_t off = 0;
  for (const auto& d : dtypes) {
    h[d.name] = {{"dtype", d.name}, {"shape", {3}}, {"data_offsets", {off, off + d.bytes_for_3}}};
    off += d.bytes_for_3;
  }
  const std::string p = write("all.safetensors", image(h.dump(), off));
  SafetensorsFile f = SafetensorsFile::open(p);
  ASSERT_EQ(f.entries().size(), std::size(dtypes));
  for (const auto& d : dtypes) {
    EXPECT_EQ(f.entry(d.name).dtype, d.name);
    EXPECT_EQ(f.bytes(d.name).size(), d.bytes_for_3) << d.name;
  }
  // F4 packs two per byte; an even count needs exactly half.
  const std::string q =
      write("f4.safetensors", image(R"({"p":{"dtype":"F4","shape":[2,4],"data_offsets":[0,4]}})", 4));
  EXPECT_EQ(SafetensorsFile::open(q).bytes("p").size(), 4u);
}

TEST_F(Safetensors, HeaderPaddedWithSpacesAndEmptyFile) {
  const std::string p =
      write("pad.safetensors", image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})"
                                     "       ",
                                     4));
  EXPECT_EQ(SafetensorsFile::open(p).tensor("a").numel(), 1);
  const std::string q = write("nothing.safetensors", image("{}", 0));
  EXPECT_TRUE(SafetensorsFile::open(q).entries().empty());
}

TEST_F(Safetensors, TruncatedFiles) {
  expect_open_error("zero.safetensors", "", {"too short"});
  expect_open_error("short.safetensors", std::string("\x10\0\0", 3), {"too short"});
  const std::string good = image(R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})", 16);
  const size_t header_end = good.size() - 16;
  expect_open_error("header_cut.safetensors", good.substr(0, header_end - 10),
                    {"header length", "beyond the file"});
  expect_open_error("data_cut.safetensors", good.substr(0, good.size() - 3),
                    {"tensor 'w'", "data_offsets", "beyond the data section"});
}

TEST_F(Safetensors, HeaderLengthBeyondFileOrAbsurd) {
  expect_open_error("huge.safetensors", le64(~uint64_t{0}) + "{}", {"header length", "beyond the file"});
  expect_open_error("big.safetensors", le64(uint64_t{1} << 40) + "{}", {"header length", "beyond the file"});
  expect_open_error("tiny.safetensors", le64(0) + "{}", {"header length 0"});
}

TEST_F(Safetensors, InvalidJsonAndNonObjectHeaders) {
  expect_open_error("badjson.safetensors", image(R"({"w": {"dtype": )", 0), {"not valid JSON"});
  expect_open_error("trailing.safetensors", image(R"({} x)", 0), {"not valid JSON"});
  expect_open_error("array.safetensors", image(R"([1, 2])", 0), {"must start with '{'"});
  expect_open_error("utf8.safetensors",
                    image("{\"\xff\xfe\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0),
                    {"not valid JSON"});
  expect_open_error("dup.safetensors",
                    image(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                          R"("w":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                          2),
                    {"duplicate key 'w'"});
}

TEST_F(Safetensors, EntryFieldErrors) {
  auto one = [](const std::string& entry, size_t data = 8) { return image(R"({"t":)" + entry + "}", data); };
  expect_open_error("notobj.safetensors", one("[1]"), {"tensor 't'", "must be a JSON object"});
  expect_open_error("missing.safetensors", one(R"({"dtype":"F32","shape":[2]})"),
                    {"tensor 't'", "missing field 'data_offsets'"});
  expect_open_error("extra.safetensors", one(R"({"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1})"),
                    {"tensor 't'", "unexpected field 'x'"});
  expect_open_error("dtype_type.safetensors", one(R"({"dtype":32,"shape":[2],"data_offsets":[0,8]})"),
                    {"tensor 't'", "field 'dtype' must be a string"});
  expect_open_error("unknown_dtype.safetensors", one(R"({"dtype":"F17","shape":[2],"data_offsets":[0,8]})"),
                    {"tensor 't'", "unknown dtype 'F17'"});
  expect_open_error("shape_type.safetensors", one(R"({"dtype":"F32","shape":"2","data_offsets":[0,8]})"),
                    {"tensor 't'", "field 'shape' must be an array"});
  expect_open_error("neg_dim.safetensors", one(R"({"dtype":"F32","shape":[-2],"data_offsets":[0,8]})"),
                    {"tensor 't'", "field 'shape'", "non-negative integer"});
  expect_open_error("float_dim.safetensors", one(R"({"dtype":"F32","shape":[2.0],"data_offsets":[0,8]})"),
                    {"tensor 't'", "field 'shape'", "non-negative integer"});
  expect_open_error("overflow.safetensors",
                    one(R"({"dtype":"F32","shape":[4294967296,4294967296,4],"data_offsets":[0,8]})"),
                    {"tensor 't'", "field 'shape'", "overflows"});
  expect_open_error("bytes_overflow.safetensors",
                    one(R"({"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,8]})"),
                    {"tensor 't'", "overflows the byte size"});
  expect_open_error("off_type.safetensors", one(R"({"dtype":"F32","shape":[2],"data_offsets":[0,8,9]})"),
                    {"tensor 't'", "field 'data_offsets' must be an array"});
  expect_open_error("off_neg.safetensors", one(R"({"dtype":"F32","shape":[2],"data_offsets":[-8,0]})"),
                    {"tensor 't'", "field 'data_offsets' must hold non-negative integers"});
  expect_open_error("off_order.safetensors", one(R"({"dtype":"F32","shape":[0],"data_offsets":[8,0]})"),
                    {"tensor 't'", "field 'data_offsets': begin 8 > end 0"});
  expect_open_error("off_range.safetensors", one(R"({"dtype":"F32","shape":[4],"data_offsets":[0,16]})"),
                    {"tensor 't'", "field 'data_offsets': end 16 is beyond the data section (8 bytes)"});
  expect_open_error("size.safetensors", one(R"({"dtype":"F32","shape":[3],"data_offsets":[0,8]})"),
                    {"tensor 't'", "field 'data_offsets'", "holds 8 bytes", "needs 12"});
  expect_open_error("f4size.safetensors", one(R"({"dtype":"F4","shape":[3],"data_offsets":[0,1]})"),
                    {"tensor 't'", "holds 1 bytes", "needs 2"});
}

TEST_F(Safetensors, OverlappingRanges) {
  expect_open_error("overlap.safetensors",
                    image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                          R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                          12),
                    {"tensor 'b'", "data_offsets", "overlaps tensor 'a'"});
  expect_open_error("same.safetensors",
                    image(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                          R"("b":{"dtype":"I8","shape":[4],"data_offsets":[0,4]}})",
                          4),
                    {"overlaps tensor 'a'"});
  // Zero-byte tensors occupy nothing, so one placed inside another's range is not an overlap.
  const std::string p =
      write("empty_inside.safetensors", image(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                                              R"("e":{"dtype":"F32","shape":[0],"data_offsets":[2,2]}})",
                                              4));
  EXPECT_EQ(SafetensorsFile::open(p).entries().size(), 2u);
}

TEST_F(Safetensors, MetadataMustBeStrings) {
  expect_open_error("meta_num.safetensors", image(R"({"__metadata__":{"ok":"x","step":1}})", 0),
                    {"__metadata__", "'step'", "must be a string"});
  expect_open_error("meta_arr.safetensors", image(R"({"__metadata__":["x"]})", 0),
                    {"__metadata__", "must be an object"});
}

TEST_F(Safetensors, LookupErrors) {
  const std::string header = R"({"u":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                             R"("deep":{"dtype":"F32","shape":[1,1,1,1,1,1,1],"data_offsets":[4,8]}})";
  const std::string p = write("lookup.safetensors", image(header, 8));
  SafetensorsFile f = SafetensorsFile::open(p);
  for (const std::string& msg : {error_of([&] { f.entry("nope"); }), error_of([&] { f.bytes("nope"); }),
                                 error_of([&] { f.tensor("nope"); })}) {
    EXPECT_NE(msg.find(p), std::string::npos) << msg;
    EXPECT_NE(msg.find("tensor 'nope'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("no such tensor"), std::string::npos) << msg;
  }
  const std::string u8 = error_of([&] { f.tensor("u"); });
  EXPECT_NE(u8.find(p), std::string::npos) << u8;
  EXPECT_NE(u8.find("tensor 'u'"), std::string::npos) << u8;
  EXPECT_NE(u8.find("U8"), std::string::npos) << u8;
  EXPECT_NE(u8.find("bytes()"), std::string::npos) << u8;
  EXPECT_EQ(f.bytes("u").size(), 4u);
  const std::string deep = error_of([&] { f.tensor("deep"); });
  EXPECT_NE(deep.find("tensor 'deep'"), std::string::npos) << deep;
  EXPECT_NE(deep.find("7 dims"), std::string::npos) << deep;
}

TEST_F(Safetensors, OpenErrorsForMissingFileAndDirectory) {
  const std::string missing = file("does_not_exist.safetensors");
  std::string msg = error_of([&] { SafetensorsFile::open(missing); });
  EXPECT_NE(msg.find(missing), std::string::npos) << msg;
  EXPECT_NE(msg.find("cannot open"), std::string::npos) << msg;
  msg = error_of([&] { SafetensorsFile::open(dir_.string()); });
  EXPECT_NE(msg.find("not a regular file"), std::string::npos) << msg;
}

TEST_F(Safetensors, SaveErrorsKeepThePreviousFile) {
  const std::string p = file("keep.safetensors");
  xmoe::save_safetensors(p, {{"old", iota({2}, DType::f32, 1.0, 1.0)}});
  const std::string before = read_all(p);
  const Tensor t = iota({2}, DType::f32, 5.0, 1.0);

  std::string msg = error_of([&] { xmoe::save_safetensors(p, {{"a", t}, {"a", t}}); });
  EXPECT_NE(msg.find("tensor 'a'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("duplicate"), std::string::npos) << msg;
  msg = error_of([&] { xmoe::save_safetensors(p, {{"__metadata__", t}}); });
  EXPECT_NE(msg.find("reserved"), std::string::npos) << msg;
  msg = error_of([&] { xmoe::save_safetensors(p, {{"u", Tensor()}}); });
  EXPECT_NE(msg.find("tensor 'u'"), std::string::npos) << msg;
  msg = error_of([&] { xmoe::save_safetensors(p, {{"bad\xff", t}}); });
  EXPECT_NE(msg.find("UTF-8"), std::string::npos) << msg;
  EXPECT_NE(msg.find(p), std::string::npos) << msg;

  EXPECT_EQ(read_all(p), before);
  EXPECT_FALSE(fs::exists(p + ".tmp"));

  // Writing into a missing directory fails cleanly too.
  msg = error_of([&] { xmoe::save_safetensors(file("no/such/dir.safetensors"), {{"a", t}}); });
  EXPECT_NE(msg.find("cannot create"), std::string::npos) << msg;

  // A successful save replaces the file.
  xmoe::save_safetensors(p, {{"new", t}});
  SafetensorsFile f = SafetensorsFile::open(p);
  EXPECT_FALSE(f.contains("old"));
  EXPECT_EQ(f.tensor("new").get(1), 6.0);
}

// Every prefix and many single-byte corruptions of a valid file must open or throw xmoe::Error, never crash;
// under ASan/UBSan this also catches reads past the mapping.
TEST_F(Safetensors, CorruptionNeverCrashes) {
  const std::string p = file("src.safetensors");
  xmoe::save_safetensors(p,
                         {{"a", iota({3, 2}, DType::f32, 0.0, 1.0)},
                          {"b", iota({5}, DType::bf16, 1.0, 0.5)},
                          {"c", iota({2}, DType::f64, -1.0, 2.0)}},
                         {{"k", "v"}});
  const std::string good = read_all(p);
  const std::string q = file("mutant.safetensors");
  auto exercise = [&](const std::string& bytes) {
    write_all(q, bytes);
    try {
      SafetensorsFile f = SafetensorsFile::open(q);
      for (const auto& e : f.entries()) {
        auto b = f.bytes(e.name);
        unsigned sum = 0;
        for (std::byte x : b) sum += static_cast<unsigned>(x);
        (void)sum;
        try {
          Tensor t = f.tensor(e.name);
          for (int64_t i = 0; i < t.numel(); ++i) (void)t.get(i);
        } catch (const xmoe::Error&) {
        }
      }
    } catch (const xmoe::Error&) {
    }
  };
  for (size_t len = 0; len < good.size(); ++len) exercise(good.substr(0, len));
  uint64_t n = 0;
  std::memcpy(&n, good.data(), 8);
  for (size_t i = 0; i < 8 + n; ++i) {
    for (char c : {'\0', '"', '9', '-', '[', '}', '\xff'}) {
      std::string m = good;
      m[i] = c;
      exercise(m);
    }
  }
}

// The share of the pages under [p, p + bytes) whose page-table entry is present (bit 63 of
// /proc/self/pagemap), or -1 where pagemap cannot be read.
double present_share(const std::byte* p, size_t bytes) {
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t first = reinterpret_cast<uintptr_t>(p) / page,
                  last = (reinterpret_cast<uintptr_t>(p) + bytes - 1) / page;
  const int fd = ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  size_t present = 0;
  bool ok = true;
  for (uintptr_t v = first; v <= last && ok; ++v) {
    uint64_t entry = 0;
    ok = ::pread(fd, &entry, 8, static_cast<off_t>(v * 8)) == 8;
    present += (entry >> 63) & 1;
  }
  ::close(fd);
  if (!ok) return -1;
  return static_cast<double>(present) / static_cast<double>(last - first + 1);
}

TEST_F(Safetensors, PrefaultMapsTheRangeIntoThePageTables) {
  // 8 MiB of U8 codes, never read: opening parses only the header at the file's start, so the data's last
  // 4 MiB have no page-table entries until prefault puts them there (without reading them through a load).
  std::vector<std::byte> codes(size_t{8} << 20, std::byte{7});
  const std::string p = file("codes.safetensors");
  xmoe::save_safetensors_raw(p, {{"codes", "U8", {static_cast<int64_t>(codes.size())}, {codes}}});
  const SafetensorsFile f = SafetensorsFile::open(p);
  const std::span<const std::byte> data = f.bytes("codes");
  const std::span<const std::byte> tail = data.subspan(data.size() / 2);
  const double before = present_share(tail.data(), tail.size());
  if (before < 0) GTEST_SKIP() << "/proc/self/pagemap is not readable here";
  EXPECT_LT(before, 0.5);
  const int error = f.prefault(f.entry("codes").begin + data.size() / 2, f.entry("codes").end);
  if (error == EINVAL || error == ENOSYS) GTEST_SKIP() << "no MADV_POPULATE_READ on this kernel";
  ASSERT_EQ(error, 0) << std::strerror(error);
  EXPECT_EQ(present_share(tail.data(), tail.size()), 1.0);
  EXPECT_EQ(tail[tail.size() - 1], std::byte{7});
  // A range past the data section is the caller's bug, named.
  const std::string message = error_of([&] { (void)f.prefault(0, f.entry("codes").end + 1); });
  EXPECT_NE(message.find(p), std::string::npos) << message;
  EXPECT_NE(message.find("outside the data section"), std::string::npos) << message;
}

}  // namespace
