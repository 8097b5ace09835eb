// Checkpoint resharding (tutel.checkpoint gather/scatter) on per-rank safetensors files.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>
#include "cli_runner.hpp"

#include <array>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "xmoe/error.hpp"
#include "xmoe/reshard.hpp"
#include "xmoe/safetensors.hpp"

namespace {

namespace fs = std::filesystem;

struct Raw {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;
};
using Meta = std::map<std::string, std::string>;

// An independent writer (any dtype), so the tests do not depend on the code under test to make inputs.
void write_file(const std::string& path, const std::vector<Raw>& tensors, const Meta& meta) {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!meta.empty()) h["__metadata__"] = meta;
  uint64_t off = 0;
  for (const auto& t : tensors) {
    h[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {off, off + t.data.size()}}};
    off += t.data.size();
  }
  std::string text = h.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  const uint64_t n = text.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const auto& t : tensors)
    out.write(reinterpret_cast<const char*>(t.data.data()), static_cast<std::streamsize>(t.data.size()));
  ASSERT_TRUE(out.good()) << path;
}

std::vector<Raw> read_tensors(const std::string& path) {
  auto f = xmoe::SafetensorsFile::open(path);
  std::vector<Raw> out;
  for (const auto& e : f.entries()) {
    const auto b = f.bytes(e.name);
    Raw r{e.name, e.dtype, e.shape, {}};
    r.data.resize(b.size());
    if (!b.empty()) std::memcpy(r.data.data(), b.data(), b.size());
    out.push_back(std::move(r));
  }
  return out;
}

Meta read_meta(const std::string& path) {
  return xmoe::SafetensorsFile::open(path).metadata();
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

const Raw& find(const std::vector<Raw>& ts, const std::string& name) {
  for (const auto& t : ts)
    if (t.name == name) return t;
  throw std::runtime_error("no tensor " + name);
}

size_t elem_size(const std::string& dtype) {
  if (dtype == "F32") return 4;
  if (dtype == "F64") return 8;
  if (dtype == "BF16") return 2;
  return 1;
}

Raw random_tensor(std::mt19937& rng, const std::string& name, const std::string& dtype,
                  std::vector<int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  Raw r{name, dtype, std::move(shape), std::vector<uint8_t>(static_cast<size_t>(n) * elem_size(dtype))};
  for (auto& b : r.data) b = static_cast<uint8_t>(rng());
  return r;
}

constexpr int64_t kE = 4, kH = 4, kM = 6, kO = 6;

class Reshard : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ =
        fs::path(::testing::TempDir()) / ("xmoe_reshard_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::mt19937 rng(1234);
    global_ = {
        random_tensor(rng, "gate.wg", "F32", {kE, kM}),
        random_tensor(rng, "experts.batched_fc1_w", "F32", {kE, kH, kM}),
        random_tensor(rng, "experts.batched_fc2_w", "F32", {kE, kH, kO}),
        random_tensor(rng, "experts.batched_fc1_bias", "F32", {kE, kH}),
        random_tensor(rng, "experts.batched_fc2_bias", "F32", {kE, kO}),
        random_tensor(rng, "experts.scale_bf16", "BF16", {kE, 2, 4}),
        random_tensor(rng, "experts.q_u8", "U8", {kE, 1, 8}),
        random_tensor(rng, "norm.f64", "F64", {3}),
    };
    global_path_ = path("global.safetensors");
    write_file(global_path_, global_, {{"_num_global_experts", "4"}, {"note", "kept"}});
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::vector<std::string> rank_files(const std::string& pattern, int n) const {
    std::vector<std::string> out;
    for (int r = 0; r < n; ++r) out.push_back(xmoe::expand_rank_pattern(path(pattern), r, n));
    return out;
  }

  fs::path dir_;
  std::vector<Raw> global_;
  std::string global_path_;
};

TEST(ReshardPattern, ExpandsRankAndSize) {
  EXPECT_EQ(xmoe::expand_rank_pattern("ckpt-{rank}-of-{size}.st", 3, 8), "ckpt-3-of-8.st");
  EXPECT_EQ(xmoe::expand_rank_pattern("{rank}/{rank}.st", 1, 2), "1/1.st");
  EXPECT_EQ(xmoe::expand_rank_pattern("single.st", 0, 1), "single.st");
  EXPECT_THROW(xmoe::expand_rank_pattern("single.st", 0, 2), xmoe::Error);
  EXPECT_THROW(xmoe::expand_rank_pattern("{rank}.st", 2, 2), xmoe::Error);
}

TEST_F(Reshard, ScatterGatherRoundTripsBitExactly) {
  for (int n : {1, 2, 4, 8}) {
    SCOPED_TRACE("N = " + std::to_string(n));
    const std::string pattern = "n" + std::to_string(n) + "/ckpt-{rank}-of-{size}.safetensors";
    xmoe::reshard_scatter(global_path_, n, path(pattern));
    const auto files = rank_files(pattern, n);
    for (int r = 0; r < n; ++r) {
      const Meta md = read_meta(files[r]);
      EXPECT_EQ(md.at("_num_global_experts"), "4");
      EXPECT_EQ(md.at("_world_size"), std::to_string(n));
      EXPECT_EQ(md.at("_rank"), std::to_string(r));
      EXPECT_EQ(md.at("note"), "kept");
      const auto ts = read_tensors(files[r]);
      ASSERT_EQ(ts.size(), global_.size());
      EXPECT_EQ(find(ts, "experts.batched_fc1_w").shape[0], n <= kE ? kE / n : 1);
      EXPECT_EQ(find(ts, "gate.wg").data, find(global_, "gate.wg").data);
    }
    const std::string merged = path("merged" + std::to_string(n) + ".safetensors");
    xmoe::reshard_gather(files, merged);
    const auto ts = read_tensors(merged);
    ASSERT_EQ(ts.size(), global_.size());
    for (const auto& g : global_) {
      const Raw& t = find(ts, g.name);
      EXPECT_EQ(t.dtype, g.dtype) << g.name;
      EXPECT_EQ(t.shape, g.shape) << g.name;
      EXPECT_TRUE(t.data == g.data) << g.name;
    }
    const Meta md = read_meta(merged);
    EXPECT_EQ(md.at("_num_global_experts"), "4");
    EXPECT_EQ(md.at("note"), "kept");
    EXPECT_EQ(md.count("_expert_shape.experts.batched_fc1_w"), 0u);
  }
}

TEST_F(Reshard, ScatterGatherScatterEqualsDirectScatter) {
  xmoe::reshard_scatter(global_path_, 4, path("a-{rank}.st"));
  xmoe::reshard_gather(rank_files("a-{rank}.st", 4), path("a-merged.st"));
  xmoe::reshard_scatter(path("a-merged.st"), 2, path("b-{rank}.st"));
  xmoe::reshard_scatter(global_path_, 2, path("c-{rank}.st"));
  for (int r = 0; r < 2; ++r) {
    const std::string b = file_bytes(path("b-" + std::to_string(r) + ".st"));
    EXPECT_FALSE(b.empty());
    EXPECT_TRUE(b == file_bytes(path("c-" + std::to_string(r) + ".st"))) << "rank " << r;
  }
  // Through the sharded layout too: 8 ranks → merged → 8 ranks gives the same files.
  xmoe::reshard_scatter(global_path_, 8, path("d-{rank}.st"));
  xmoe::reshard_gather(rank_files("d-{rank}.st", 8), path("d-merged.st"));
  xmoe::reshard_scatter(path("d-merged.st"), 8, path("e-{rank}.st"));
  for (int r = 0; r < 8; ++r)
    EXPECT_TRUE(file_bytes(path("d-" + std::to_string(r) + ".st")) ==
                file_bytes(path("e-" + std::to_string(r) + ".st")))
        << "rank " << r;
}

// The bytes of element `flat` (C order) of a tensor.
std::vector<uint8_t> elem(const Raw& g, int64_t flat) {
  const size_t s = elem_size(g.dtype);
  return {g.data.begin() + static_cast<ptrdiff_t>(flat * s),
          g.data.begin() + static_cast<ptrdiff_t>((flat + 1) * s)};
}

TEST_F(Reshard, ScatteredRanksHoldTheExpectedSlices) {
  // E % N == 0: N = 2, rank 1 holds experts 2 and 3.
  xmoe::reshard_scatter(global_path_, 2, path("s-{rank}.st"));
  {
    const auto ts = read_tensors(path("s-1.st"));
    const Raw& w = find(ts, "experts.batched_fc1_w");
    const Raw& g = find(global_, "experts.batched_fc1_w");
    ASSERT_EQ(w.shape, (std::vector<int64_t>{2, kH, kM}));
    for (int64_t e = 0; e < 2; ++e)
      for (int64_t h = 0; h < kH; ++h)
        for (int64_t m = 0; m < kM; ++m) {
          const int64_t local = (e * kH + h) * kM + m;
          const int64_t global = ((2 + e) * kH + h) * kM + m;
          ASSERT_EQ(elem(w, local), elem(g, global)) << e << " " << h << " " << m;
        }
  }
  // N % E == 0: N = 8, d = 2; rank 5 holds the second half of expert 2.
  xmoe::reshard_scatter(global_path_, 8, path("t-{rank}.st"));
  const auto ts = read_tensors(path("t-5.st"));
  {
    const Raw& w = find(ts, "experts.batched_fc1_w");
    const Raw& g = find(global_, "experts.batched_fc1_w");
    ASSERT_EQ(w.shape, (std::vector<int64_t>{1, kH / 2, kM}));
    for (int64_t h = 0; h < kH / 2; ++h)
      for (int64_t m = 0; m < kM; ++m)
        ASSERT_EQ(elem(w, h * kM + m), elem(g, (2 * kH + kH / 2 + h) * kM + m)) << h << " " << m;
  }
  EXPECT_EQ(find(ts, "experts.batched_fc2_w").shape, (std::vector<int64_t>{1, kH / 2, kO}));
  EXPECT_EQ(find(ts, "experts.batched_fc1_bias").shape, (std::vector<int64_t>{1, kH / 2}));
  {
    const Raw& b = find(ts, "experts.batched_fc2_bias");
    const Raw& g = find(global_, "experts.batched_fc2_bias");
    ASSERT_EQ(b.shape, (std::vector<int64_t>{1, kO / 2}));
    for (int64_t o = 0; o < kO / 2; ++o) EXPECT_EQ(elem(b, o), elem(g, 2 * kO + kO / 2 + o)) << o;
  }
  {
    // U8 [E, 1, 8]: the first non-1 dim after the expert dim is the last one.
    const Raw& q = find(ts, "experts.q_u8");
    const Raw& g = find(global_, "experts.q_u8");
    ASSERT_EQ(q.shape, (std::vector<int64_t>{1, 1, 4}));
    for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(q.data[i], g.data[2 * 8 + 4 + i]) << i;
  }
  EXPECT_EQ(find(ts, "experts.scale_bf16").shape, (std::vector<int64_t>{1, 1, 4}));
  EXPECT_EQ(find(ts, "gate.wg").data, find(global_, "gate.wg").data);
  EXPECT_EQ(read_meta(path("t-5.st")).at("_expert_shape.experts.batched_fc1_w"), "[4, 6]");
}

TEST_F(Reshard, GatherToleratesMissingRankMetadataAndInfersShapes) {
  // Rank files as a writer that only sets _num_global_experts would make them (no _world_size/_rank, no
  // _expert_shape.*): the sharded shapes are inverted by the first-non-1-dim rule.
  xmoe::reshard_scatter(global_path_, 8, path("r-{rank}.st"));
  for (const auto& f : rank_files("r-{rank}.st", 8))
    write_file(f, read_tensors(f), {{"_num_global_experts", "4"}});
  xmoe::reshard_gather(rank_files("r-{rank}.st", 8), path("merged.st"));
  const auto ts = read_tensors(path("merged.st"));
  for (const auto& g : global_) {
    if (g.name == "experts.scale_bf16") continue;  // [E, 2, 4] → shard [1, 1, 4] is ambiguous, see below
    EXPECT_EQ(find(ts, g.name).shape, g.shape) << g.name;
    EXPECT_TRUE(find(ts, g.name).data == g.data) << g.name;
  }
  // Without the recorded shape, a shard [1, 1, 4] is read as [1, 1, 8]: same bytes, same element count.
  EXPECT_EQ(find(ts, "experts.scale_bf16").shape, (std::vector<int64_t>{kE, 1, 8}));
  EXPECT_TRUE(find(ts, "experts.scale_bf16").data == find(global_, "experts.scale_bf16").data);

  // And the E % N == 0 layout without any metadata: E is inferred as N × local experts.
  xmoe::reshard_scatter(global_path_, 2, path("p-{rank}.st"));
  for (const auto& f : rank_files("p-{rank}.st", 2)) write_file(f, read_tensors(f), {});
  xmoe::reshard_gather(rank_files("p-{rank}.st", 2), path("merged2.st"));
  EXPECT_EQ(read_meta(path("merged2.st")).at("_num_global_experts"), "4");
  for (const auto& g : global_) EXPECT_TRUE(find(read_tensors(path("merged2.st")), g.name).data == g.data);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const xmoe::Error& e) {
    return e.what();
  }
  return "(no error)";
}

bool has(const std::string& s, const std::string& needle) {
  return s.find(needle) != std::string::npos;
}

TEST_F(Reshard, ErrorsNameTheProblem) {
  // N = 3 with E = 4.
  std::string msg = error_of([&] { xmoe::reshard_scatter(global_path_, 3, path("x-{rank}.st")); });
  EXPECT_TRUE(has(msg, "4 experts") && has(msg, "N = 3")) << msg;
  EXPECT_FALSE(fs::exists(path("x-0.st")));

  // Pattern without {rank}.
  msg = error_of([&] { xmoe::reshard_scatter(global_path_, 2, path("same.st")); });
  EXPECT_TRUE(has(msg, "{rank}")) << msg;

  xmoe::reshard_scatter(global_path_, 2, path("ok-{rank}.st"));
  const auto files = rank_files("ok-{rank}.st", 2);

  // Missing rank file.
  msg = error_of([&] { xmoe::reshard_gather({files[0], path("missing-1.st")}, path("m.st")); });
  EXPECT_TRUE(has(msg, "rank 1") && has(msg, "missing-1.st")) << msg;

  // Inconsistent E across files.
  auto meta1 = read_meta(files[1]);
  auto bad_e = meta1;
  bad_e["_num_global_experts"] = "8";
  write_file(path("bad_e-1.st"), read_tensors(files[1]), bad_e);
  msg = error_of([&] { xmoe::reshard_gather({files[0], path("bad_e-1.st")}, path("m.st")); });
  EXPECT_TRUE(has(msg, "_num_global_experts") && has(msg, "rank 1") && has(msg, "bad_e-1.st")) << msg;

  // A shared tensor that differs between ranks.
  auto ts0 = read_tensors(files[0]);
  for (auto& t : ts0)
    if (t.name == "gate.wg") t.data[5] ^= 1;
  write_file(path("bad_gate-0.st"), ts0, read_meta(files[0]));
  msg = error_of([&] { xmoe::reshard_gather({path("bad_gate-0.st"), files[1]}, path("m.st")); });
  EXPECT_TRUE(has(msg, "gate.wg") && has(msg, "rank 0") && has(msg, "bad_gate-0.st") && has(msg, "differs"))
      << msg;

  // A tensor missing on one rank, and a dtype mismatch.
  auto ts1 = read_tensors(files[1]);
  ts1.pop_back();
  write_file(path("short-1.st"), ts1, meta1);
  msg = error_of([&] { xmoe::reshard_gather({files[0], path("short-1.st")}, path("m.st")); });
  EXPECT_TRUE(has(msg, "norm.f64") && has(msg, "rank 1")) << msg;

  // Rank metadata that contradicts the file order.
  msg = error_of([&] { xmoe::reshard_gather({files[1], files[0]}, path("m.st")); });
  EXPECT_TRUE(has(msg, "_rank")) << msg;

  // An expert tensor whose dims are not divisible by d.
  write_file(path("odd.st"), {{"experts.w", "F32", {2, 3}, std::vector<uint8_t>(24)}},
             {{"_num_global_experts", "2"}});
  msg = error_of([&] { xmoe::reshard_scatter(path("odd.st"), 4, path("odd-{rank}.st")); });
  EXPECT_TRUE(has(msg, "experts.w") && has(msg, "divisible")) << msg;

  // Scattering a rank file instead of a merged one.
  msg = error_of([&] { xmoe::reshard_scatter(files[0], 2, path("y-{rank}.st")); });
  EXPECT_TRUE(has(msg, "_world_size")) << msg;
}

using xmoe::testing_cli::CliRun;
using xmoe::testing_cli::run_cli;

TEST_F(Reshard, CliScatterAndGather) {
  CliRun r = run_cli("reshard scatter --input '" + global_path_ + "' --output_size 8 --outputs '" +
                     path("cli-{rank}-of-{size}.st") + "'");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(fs::exists(path("cli-7-of-8.st")));
  r = run_cli("reshard gather --inputs '" + path("cli-{rank}-of-{size}.st") + "' --input_size 8 --output '" +
              path("cli-merged.st") + "'");
  ASSERT_EQ(r.code, 0) << r.output;
  for (const auto& g : global_) EXPECT_TRUE(find(read_tensors(path("cli-merged.st")), g.name).data == g.data);

  const std::pair<std::string, std::string> bad[] = {
      {"reshard", "subcommand"},
      {"reshard gather --inputs x-{rank}.st --input_size 2", "--output"},
      {"reshard gather --inputs x-{rank}.st --input_size 0 --output m.st", "--input_size"},
      {"reshard scatter --input '" + global_path_ + "' --output_size 3 --outputs '" + path("z-{rank}.st") +
           "'",
       "N = 3"},
      {"reshard scatter --input '" + path("nope.st") + "' --output_size 2 --outputs '" + path("z-{rank}.st") +
           "'",
       "nope.st"},
      {"reshard gather --inputs '" + path("cli-{rank}-of-{size}.st") + "' --input_size 9 --output '" +
           path("m.st") + "'",
       "cli-0-of-9.st"},
      {"reshard scatter --input '" + global_path_ + "' --output_size 2 --outputs '" + path("z.st") + "'",
       "{rank}"},
  };
  for (const auto& [args, needle] : bad) {
    CliRun b = run_cli(args);
    EXPECT_EQ(b.code, 2) << args << "\n" << b.output;
    EXPECT_TRUE(has(b.output, needle)) << args << "\n" << b.output;
  }
}

}  // namespace

namespace {

// A tensor sharded along a later dim (xmoe's SwiGLU down_proj [E, M, H] splits H, its hidden dim): metadata
// `_expert_split_dim.<name>` = "2" makes scatter take column blocks and gather interleave them back.
TEST_F(Reshard, ExplicitSplitDimTakesColumnBlocks) {
  std::mt19937 rng(99);
  const Raw down = random_tensor(rng, "experts.down_proj", "F32", {2, 3, 8});  // E = 2, M = 3, H = 8
  const Raw up = random_tensor(rng, "experts.up_proj", "F32", {2, 8, 4});
  write_file(path("swiglu.st"), {down, up},
             {{"_num_global_experts", "2"}, {"_expert_split_dim.experts.down_proj", "2"}});
  xmoe::reshard_scatter(path("swiglu.st"), 8, path("s-{rank}.st"));  // d = 4 ranks per expert
  for (int r = 0; r < 8; ++r) {
    const auto ts = read_tensors(path("s-" + std::to_string(r) + ".st"));
    const Raw& shard = find(ts, "experts.down_proj");
    ASSERT_EQ(shard.shape, (std::vector<int64_t>{1, 3, 2})) << r;
    const int64_t e = r / 4, j = r % 4;
    for (int64_t m = 0; m < 3; ++m)
      for (int64_t h = 0; h < 2; ++h) {
        const size_t src = static_cast<size_t>(((e * 3 + m) * 8 + j * 2 + h) * 4);
        const size_t dst = static_cast<size_t>((m * 2 + h) * 4);
        EXPECT_EQ(std::memcmp(&shard.data[dst], &down.data[src], 4), 0)
            << "rank " << r << " m " << m << " h " << h;
      }
    // Without the metadata a tensor keeps Tutel's flat split (first non-1 dim).
    EXPECT_EQ(find(ts, "experts.up_proj").shape, (std::vector<int64_t>{1, 2, 4})) << r;
  }
  xmoe::reshard_gather(rank_files("s-{rank}.st", 8), path("back.st"));
  const auto back = read_tensors(path("back.st"));
  EXPECT_EQ(find(back, "experts.down_proj").shape, down.shape);
  EXPECT_TRUE(find(back, "experts.down_proj").data == down.data);
  EXPECT_TRUE(find(back, "experts.up_proj").data == up.data);
  EXPECT_EQ(read_meta(path("back.st")).at("_expert_split_dim.experts.down_proj"), "2");

  // A split dim that is not divisible, or out of range, is an error naming the tensor.
  write_file(path("bad.st"), {down},
             {{"_num_global_experts", "2"}, {"_expert_split_dim.experts.down_proj", "1"}});
  std::string msg;
  try {
    xmoe::reshard_scatter(path("bad.st"), 8, path("b-{rank}.st"));
  } catch (const xmoe::Error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("experts.down_proj"), std::string::npos) << msg;
  write_file(path("bad2.st"), {down},
             {{"_num_global_experts", "2"}, {"_expert_split_dim.experts.down_proj", "7"}});
  msg.clear();
  try {
    xmoe::reshard_scatter(path("bad2.st"), 4, path("c-{rank}.st"));
  } catch (const xmoe::Error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("_expert_split_dim.experts.down_proj"), std::string::npos) << msg;
}

}  // namespace
