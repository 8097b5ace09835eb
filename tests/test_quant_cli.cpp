// `xmoe init-model --quant` and `xmoe quantize` end to end: the tensors written for every quantized linear
// (names, dtypes, shapes as the published layouts), read back and dequantised, equal the f32 checkpoint of
// the same seed within the format's rounding bound; quantize of that f32 checkpoint writes the same bytes;
// the unquantized modules stay as they were; the quantization config is where transformers / ModelOpt look;
// bad flags and inputs fail naming what is wrong. (tools/check_quant_checkpoints.py checks the same
// checkpoints with transformers itself.)
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli_runner.hpp"
#include "kernels/packed_weight.hpp"
#include "kernels/quant/codecs.hpp"
#include "quant_fixture.hpp"
#include "xmoe/safetensors.hpp"

namespace xmoe::kernels {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing_cli::run_cli;

const std::string kConfig = std::string(XMOE_TEST_DATA_DIR) + "/checkpoints/tiny_config.json";

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/xmoe_quant_XXXXXX";
    path_ = ::mkdtemp(tmpl);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

json read_json(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in);
}

bool is_linear(const std::string& name) {
  for (const char* p : {".q_proj.weight", ".k_proj.weight", ".v_proj.weight", ".o_proj.weight",
                        ".gate_proj.weight", ".up_proj.weight", ".down_proj.weight"}) {
    const std::string s = p;
    if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0) return true;
  }
  return false;
}

std::vector<float> f32_values(const SafetensorsFile& f, const std::string& name) {
  return test::fixture_values<float>(f, name);
}

// The PackedWeight a loader builds from a quantized linear's tensors (checking their dtypes and shapes).
PackedWeight packed_view(const SafetensorsFile& f, const std::string& fmt, const std::string& layout,
                         const std::string& base, int64_t rows, int64_t cols) {
  PackedWeight w;
  w.rows = rows;
  w.cols = cols;
  const auto expect = [&](const std::string& name, const std::string& dtype, std::vector<int64_t> shape) {
    EXPECT_EQ(f.entry(name).dtype, dtype) << name;
    EXPECT_EQ(f.entry(name).shape, shape) << name;
    return f.bytes(name).data();
  };
  if (fmt == "fp8-block") {
    w.format = WeightFormat::fp8_block;
    w.data = expect(base + ".weight", "F8_E4M3", {rows, cols});
    w.row_bytes = cols;
    w.scale_type = ScaleType::f32;
    w.scales = expect(base + ".weight_scale_inv", "F32", {(rows + 127) / 128, (cols + 127) / 128});
    w.scale_row_stride = (cols + 127) / 128;
    w.block_rows = w.block_cols = 128;
  } else if (fmt == "mxfp4") {
    w.format = WeightFormat::mxfp4;
    w.data = expect(base + ".weight_packed", "U8", {rows, cols / 2});
    w.row_bytes = cols / 2;
    w.scale_type = ScaleType::e8m0;
    w.scales = expect(base + ".weight_scale", "U8", {rows, cols / 32});
    w.scale_row_stride = cols / 32;
    w.block_cols = 32;
  } else if (layout == "compressed-tensors") {
    w.format = WeightFormat::nvfp4;
    w.data = expect(base + ".weight_packed", "U8", {rows, cols / 2});
    w.row_bytes = cols / 2;
    w.scale_type = ScaleType::e4m3;
    w.scales = expect(base + ".weight_scale", "F8_E4M3", {rows, cols / 16});
    w.scale_row_stride = cols / 16;
    w.block_cols = 16;
    float stored;  // the inverse of the multiplier
    std::memcpy(&stored, expect(base + ".weight_global_scale", "F32", {1}), 4);
    w.global_scale = 1.0f / stored;
    expect(base + ".input_global_scale", "F32", {1});
  } else {
    w.format = WeightFormat::nvfp4;
    w.data = expect(base + ".weight", "U8", {rows, cols / 2});
    w.row_bytes = cols / 2;
    w.scale_type = ScaleType::e4m3;
    w.scales = expect(base + ".weight_scale", "F8_E4M3", {rows, cols / 16});
    w.scale_row_stride = cols / 16;
    w.block_cols = 16;
    std::memcpy(&w.global_scale, expect(base + ".weight_scale_2", "F32", {}), 4);
    expect(base + ".input_scale", "F32", {});
  }
  return w;
}

// |dequant − w| within half a step of the format's grid at w (see tools/check_quant_checkpoints.py).
void expect_within_bound(const std::string& fmt, const PackedWeight& q, const std::vector<float>& w,
                         const std::string& name) {
  std::vector<float> row(static_cast<size_t>(q.cols));
  int bad = 0;
  for (int64_t r = 0; r < q.rows; ++r) {
    q.row_to_f32(r, row.data());
    for (int64_t c = 0; c < q.cols; ++c) {
      const float orig = w[r * q.cols + c];
      // The block's multiplier (the codecs are checked against torch in test_quant_codecs.cpp).
      float s;
      const int64_t si = (r / q.block_rows) * q.scale_row_stride + c / q.block_cols;
      if (fmt == "fp8-block")
        std::memcpy(&s, q.scales + 4 * si, 4);
      else if (fmt == "mxfp4")
        s = quant::e8m0_to_f32(static_cast<uint8_t>(q.scales[si]));
      else
        s = quant::e4m3_to_f32(static_cast<uint8_t>(q.scales[si])) * q.global_scale;
      const double bound = fmt == "fp8-block" ? std::max(std::fabs(orig) / 16.0, s * std::ldexp(1.0, -10))
                                              : std::max(std::fabs(orig) / 4.0, s * 0.5);
      if (!(std::fabs(double(row[c]) - orig) <= bound * (1 + 1e-6)) && ++bad < 5)
        ADD_FAILURE() << fmt << " " << name << " (" << r << ", " << c << "): " << row[c] << " vs " << orig
                      << " (bound " << bound << ")";
    }
  }
  EXPECT_EQ(bad, 0) << name;
}

class QuantCli : public ::testing::TestWithParam<std::string> {};

// The parameter: a --quant format, optionally "/" and a --quant-layout.
TEST_P(QuantCli, InitModelAndQuantizeWriteThePublishedLayout) {
  const std::string param = GetParam(), fmt = param.substr(0, param.find('/'));
  const std::string layout = fmt == param ? "" : param.substr(fmt.size() + 1);
  const std::string layout_flag = layout.empty() ? "" : " --quant-layout " + layout;
  TempDir dir;
  auto r = run_cli("init-model --config " + kConfig + " --out " + dir / "f32" + " --dtype f32 --seed 9");
  ASSERT_EQ(r.code, 0) << r.output;
  r = run_cli("init-model --config " + kConfig + " --out " + dir / "q" + " --quant " + fmt + layout_flag +
              " --seed 9");
  ASSERT_EQ(r.code, 0) << r.output;
  r = run_cli("quantize --to " + fmt + layout_flag + " " + dir / "f32" + " " + dir / "converted");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto ref = SafetensorsFile::open(dir / "f32/model.safetensors");
  const auto q = SafetensorsFile::open(dir / "q/model.safetensors");
  const auto conv = SafetensorsFile::open(dir / "converted/model.safetensors");
  int linears = 0;
  for (const auto& e : ref.entries()) {
    if (!is_linear(e.name)) {
      // Unquantized modules: present in the writer's dtype (BF16 from init-model, as is from quantize).
      EXPECT_EQ(q.entry(e.name).dtype, "BF16") << e.name;
      EXPECT_EQ(q.entry(e.name).shape, e.shape) << e.name;
      EXPECT_EQ(conv.entry(e.name).dtype, "F32") << e.name;
      continue;
    }
    ++linears;
    const std::string base = e.name.substr(0, e.name.size() - 7);
    const PackedWeight w = packed_view(q, fmt, layout, base, e.shape[0], e.shape[1]);
    expect_within_bound(fmt, w, f32_values(ref, e.name), e.name);
    if (layout == "ue8m0")  // DeepSeek-V3.1's block scales: powers of two
      for (int64_t i = 0; i < (w.rows + 127) / 128 * w.scale_row_stride; ++i) {
        float scale;
        std::memcpy(&scale, w.scales + 4 * i, 4);
        int e2 = 0;
        EXPECT_EQ(std::frexp(scale, &e2), 0.5f) << base << " scale " << i << " = " << scale;
      }
    // quantize of the f32 checkpoint: the same bytes.
    for (const auto& qe : q.entries())
      if (qe.name.rfind(base + ".", 0) == 0 && qe.name.find(".bias") == std::string::npos) {
        const auto a = q.bytes(qe.name), b = conv.bytes(qe.name);
        EXPECT_TRUE(a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin())) << qe.name;
      }
  }
  EXPECT_EQ(linears, 3 * 4 + 2 * 8 * 3 + 3);  // attention ×3 layers, 2 MoE layers × 8 experts, 1 dense MLP
  for (const std::string out : {"q", "converted"}) {
    const json cfg = read_json(dir / (out + "/config.json"));
    ASSERT_TRUE(cfg.contains("quantization_config")) << out;
    const json& qc = cfg["quantization_config"];
    if (fmt == "fp8-block") {
      EXPECT_EQ(qc["quant_method"], "fp8");
      EXPECT_EQ(qc["weight_block_size"], json({128, 128}));
      if (layout == "ue8m0")
        EXPECT_EQ(qc["scale_fmt"], "ue8m0");
      else
        EXPECT_FALSE(qc.contains("scale_fmt"));
      EXPECT_EQ(qc["modules_to_not_convert"][0], "lm_head");
    } else if (fmt == "mxfp4") {
      EXPECT_EQ(qc["quant_method"], "compressed-tensors");
      EXPECT_EQ(qc["format"], "mxfp4-pack-quantized");
      EXPECT_EQ(qc["config_groups"]["group_0"]["weights"]["group_size"], 32);
    } else if (layout == "compressed-tensors") {
      EXPECT_EQ(qc["quant_method"], "compressed-tensors");
      EXPECT_EQ(qc["format"], "nvfp4-pack-quantized");
      const json& group = qc["config_groups"]["group_0"];
      EXPECT_EQ(group["weights"]["strategy"], "tensor_group");
      EXPECT_EQ(group["weights"]["group_size"], 16);
      EXPECT_EQ(group["input_activations"]["dynamic"], "local");
      EXPECT_FALSE(fs::exists(dir / (out + "/hf_quant_config.json")));
    } else {
      EXPECT_EQ(qc["quant_method"], "modelopt");
      const json hf = read_json(dir / (out + "/hf_quant_config.json"));
      EXPECT_EQ(hf["quantization"]["quant_algo"], "NVFP4");
      EXPECT_EQ(hf["quantization"]["group_size"], 16);
    }
  }
  EXPECT_TRUE(fs::exists(dir / "converted/tokenizer.json"));
  EXPECT_TRUE(fs::exists(dir / "converted/generation_config.json"));
}

INSTANTIATE_TEST_SUITE_P(Quant, QuantCli,
                         ::testing::Values("fp8-block", "fp8-block/ue8m0", "mxfp4", "nvfp4",
                                           "nvfp4/compressed-tensors"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& c : name)
                             if (c == '-' || c == '/') c = '_';
                           return name;
                         });

TEST(QuantCliErrors, BadFlagsAndInputsAreNamed) {
  TempDir dir;
  auto r = run_cli("init-model --config " + kConfig + " --out " + dir / "a" + " --quant int4");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("--quant"), std::string::npos) << r.output;
  r = run_cli("init-model --config " + kConfig + " --out " + dir / "b" +
              " --quant nvfp4 --expert-layout fused");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("per-expert"), std::string::npos) << r.output;
  // A width that is not a multiple of MXFP4's 32-element block: the error names the tensor.
  json cfg = read_json(kConfig);
  cfg["hidden_size"] = 48;
  std::ofstream(dir / "odd.json") << cfg.dump();
  r = run_cli("init-model --config " + dir / "odd.json" + " --out " + dir / "c" + " --quant mxfp4");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("q_proj.weight' has 48 columns"), std::string::npos) << r.output;
  // quantize refuses an already-quantized input and a bad --to.
  ASSERT_EQ(run_cli("init-model --config " + kConfig + " --out " + dir / "fp8" + " --quant fp8-block").code,
            0);
  r = run_cli("quantize --to nvfp4 " + dir / "fp8" + " " + dir / "d");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("quantization_config"), std::string::npos) << r.output;
  r = run_cli("quantize --to q4 " + dir / "fp8" + " " + dir / "e");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("--to"), std::string::npos) << r.output;
  // A layout the format is not written in, and a layout without a format.
  r = run_cli("init-model --config " + kConfig + " --out " + dir / "f" +
              " --quant fp8-block --quant-layout modelopt");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("unknown layout 'modelopt' for fp8-block (expected ue8m0"), std::string::npos)
      << r.output;
  r = run_cli("init-model --config " + kConfig + " --out " + dir / "g" +
              " --quant-layout compressed-tensors");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("--quant-layout needs --quant"), std::string::npos) << r.output;
}

// Both NVFP4 namings of the same codes read back by xmoe: the same greedy tokens (the loader inverts
// compressed-tensors' weight_global_scale).
TEST(QuantCliNvfp4Layouts, BothNamingsGenerateTheSameTokens) {
  TempDir dir;
  json cfg = read_json(kConfig);
  cfg["attention_bias"] = false;  // as Qwen3-MoE has it (the shared tiny config tests the bias too)
  std::ofstream(dir / "config.json") << cfg.dump();
  std::string out[2];
  int i = 0;
  for (const std::string layout : {"modelopt", "compressed-tensors"}) {
    const std::string d = dir / layout;
    ASSERT_EQ(run_cli("init-model --config " + dir / "config.json" + " --out " + d +
                      " --quant nvfp4 --quant-layout " + layout + " --seed 3")
                  .code,
              0);
    const auto r = run_cli("generate --model " + d +
                           " --prompt-ids 5,17,29,3 --max-tokens 6 --temperature 0 --ignore-eos --no-stream "
                           "--print-ids");
    ASSERT_EQ(r.code, 0) << r.output;
    const size_t at = r.output.find("generated ids: ");
    ASSERT_NE(at, std::string::npos) << r.output;
    out[i++] = r.output.substr(at, r.output.find_first_not_of("generatd is:0123456789,", at) - at);
  }
  EXPECT_EQ(out[0], out[1]);
}

}  // namespace
}  // namespace xmoe::kernels
