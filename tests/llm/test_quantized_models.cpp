// Quantized Qwen3-MoE checkpoints in the published layouts (tools/make_quant_model_fixtures.py): FP8 block
// (DeepSeek, partial 128x128 edge blocks), MXFP4 (gpt-oss *_blocks / *_scales, fused experts), NVFP4
// (ModelOpt and compressed-tensors namings of the same codes). Oracle: transformers' Qwen3MoeForCausalLM in
// fp32 on the dequantised weights: logits within 1e-4 of the row's largest, greedy ids identical. Plus the
// loader's errors on bad input, each naming the tensor or config field.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "kernels/cpu_features.hpp"
#include "llm/layers/weights.hpp"
#include "llm/model_oracle.hpp"
#include "xmoe/error.hpp"

namespace xmoe::llm {
namespace {

using namespace test;
namespace fs = std::filesystem;

TEST(QuantizedModels, Fp8BlockMatchesTransformers) {
  expect_matches_oracle("quant-fp8", "quant-fp8", 1e-4);
}

TEST(QuantizedModels, Mxfp4MatchesTransformers) {
  expect_matches_oracle("quant-mxfp4", "quant-mxfp4", 1e-4);
}

TEST(QuantizedModels, Nvfp4ModelOptMatchesTransformers) {
  expect_matches_oracle("quant-nvfp4-modelopt", "quant-nvfp4", 1e-4);
}

TEST(QuantizedModels, Nvfp4CompressedTensorsMatchesTransformers) {
  expect_matches_oracle("quant-nvfp4-ct", "quant-nvfp4", 1e-4);
}

// Quantized weights are read in place whatever the dtype; bf16 changes only the other weights (read in
// place too) and the KV cache, so greedy ids still match.
TEST(QuantizedModels, Bf16DtypeKeepsGreedyIds) {
  for (const char* dir : {"quant-fp8", "quant-mxfp4", "quant-nvfp4-ct"}) {
    Loaded l = load(dir, DType::bf16);
    const std::string expected = std::string(dir) == "quant-nvfp4-ct" ? "quant-nvfp4" : dir;
    for (const Prompt& p : load_expected(expected)) {
      const ModelRun r = run_alone(*l.model, p.ids, static_cast<int>(p.greedy.size()));
      EXPECT_EQ(r.greedy, p.greedy) << dir;
    }
  }
}

// The model reads weights from the mapped files in place and keeps the mappings alive itself.
TEST(QuantizedModels, ModelOutlivesItsCheckpointObject) {
  std::unique_ptr<CausalLM> model;
  {
    const Checkpoint ckpt = Checkpoint::open(kModels + "/quant-nvfp4-ct");
    LoadOptions o;
    o.dtype = DType::bf16;
    model = load_model(ckpt, o);
  }
  const Prompt p = load_expected("quant-nvfp4").front();
  EXPECT_EQ(run_alone(*model, p.ids, static_cast<int>(p.greedy.size())).greedy, p.greedy);
}

// The loader gives a checkpoint's FP8 weights NaN-free row flags of their own (their bytes stay as they are
// while the model lives), all clear, and no other weight any.
TEST(QuantizedModels, LoaderGivesFp8WeightsRowFlags) {
  WeightLoader loader(Checkpoint::open(kModels + "/quant-fp8"), DType::f32);
  const kernels::PackedWeight q = loader.matrix("model.layers.0.self_attn.q_proj.weight", 64, 160);
  const kernels::PackedWeight k = loader.matrix("model.layers.0.self_attn.k_proj.weight", 32, 160);
  ASSERT_EQ(q.format, kernels::WeightFormat::fp8_block);
  ASSERT_NE(q.nan_free_rows, nullptr);
  ASSERT_NE(k.nan_free_rows, nullptr);
  EXPECT_NE(q.nan_free_rows, k.nan_free_rows);
  EXPECT_FALSE(q.rows_nan_free(0, 1));
  EXPECT_FALSE(q.rows_nan_free(63, 1));
  EXPECT_EQ(loader.matrix("model.layers.0.mlp.gate.weight", 8, 160).nan_free_rows, nullptr);  // BF16
}

// Every kernel level gives the best one's logits to 1e-5 (the linear kernels agree bit for bit; the
// elementwise ones, exp in SiLU and softmax, differ in the last bits).
TEST(QuantizedModels, LowerKernelLevelsAgreeWithTheBest) {
  const kernels::CpuFeatures features = kernels::detect_cpu_features();
  for (const char* dir : {"quant-fp8", "quant-mxfp4", "quant-nvfp4-modelopt"}) {
    Loaded best = load(dir, DType::f32);
    const std::vector<int32_t> prompt =
        load_expected(std::string(dir) == "quant-nvfp4-modelopt" ? "quant-nvfp4" : dir).back().ids;
    const ModelRun a = run_alone(*best.model, prompt, 3);
    for (const char* isa : {"reference", "avx2", "avx512"}) {
      if (!kernels::isa_supported(features, kernels::parse_isa(isa))) continue;
      Loaded other = load(dir, DType::f32, isa);
      const ModelRun b = run_alone(*other.model, prompt, 3);
      ASSERT_EQ(a.greedy, b.greedy) << dir << " " << isa;
      const int64_t V = best.model->config().vocab_size;
      for (size_t r = 0; r < a.prefill.size() / V; ++r)
        EXPECT_LT(row_error(a.prefill.data() + r * V, b.prefill.data() + r * V, V), 1e-5)
            << dir << " " << isa;
      for (size_t r = 0; r < a.decode.size() / V; ++r)
        EXPECT_LT(row_error(a.decode.data() + r * V, b.decode.data() + r * V, V), 1e-5) << dir << " " << isa;
    }
  }
}

// A copy of a fixture checkpoint to break: its config files as JSON, its tensors rewritten by `edit`.
class BrokenCheckpoint {
 public:
  explicit BrokenCheckpoint(const std::string& fixture)
      : dir_(fs::temp_directory_path() / ("xmoe-quant-" + fixture + "-" + std::to_string(::getpid()))) {
    fs::remove_all(dir_);
    fs::copy(kModels + "/" + fixture, dir_);
  }
  ~BrokenCheckpoint() { fs::remove_all(dir_); }
  std::string dir() const { return dir_.string(); }

  nlohmann::json read_json(const std::string& file) const {
    std::ifstream in(dir_ / file);
    return nlohmann::json::parse(in);
  }
  void write_json(const std::string& file, const nlohmann::json& j) const {
    std::ofstream(dir_ / file) << j.dump(2);
  }
  // Rewrites model.safetensors through edit(name, dtype, shape, bytes), which may change the last three; a
  // tensor for which it returns false is dropped.
  template <class Edit>
  void rewrite(Edit edit) const {
    const SafetensorsFile f = SafetensorsFile::open((dir_ / "model.safetensors").string());
    std::vector<SafetensorsRawTensor> out;
    std::vector<std::vector<std::byte>> keep;
    keep.reserve(f.entries().size());
    for (const auto& e : f.entries()) {
      const auto bytes = f.bytes(e.name);
      keep.emplace_back(bytes.begin(), bytes.end());
      SafetensorsRawTensor t{e.name, e.dtype, e.shape, {}};
      if (!edit(t.name, t.dtype, t.shape, keep.back())) continue;
      t.pieces = {std::span<const std::byte>(keep.back())};
      out.push_back(std::move(t));
    }
    save_safetensors_raw((dir_ / "model.safetensors").string(), out);
  }

 private:
  fs::path dir_;
};

// quant-mxfp4's codes in compressed-tensors' mxfp4-pack-quantized naming (what init-model --quant mxfp4
// writes): each fused gate_up_proj_blocks / down_proj_blocks [E, N, K/32, 16] becomes per-expert
// weight_packed [N, K/2] and each *_scales [E, N, K/32] per-expert weight_scale; the same values, so
// transformers' logits of quant-mxfp4 are the oracle.
TEST(QuantizedModels, Mxfp4CompressedTensorsMatchesTransformers) {
  BrokenCheckpoint b("quant-mxfp4");
  nlohmann::json cfg = b.read_json("config.json");
  cfg["quantization_config"] = {
      {"quant_method", "compressed-tensors"},
      {"format", "mxfp4-pack-quantized"},
      {"config_groups",
       {{"group_0",
         {{"format", "mxfp4-pack-quantized"},
          {"targets", {"Linear"}},
          {"weights", {{"num_bits", 4}, {"type", "float"}, {"strategy", "group"}, {"group_size", 32}}}}}}},
      {"ignore", {"lm_head", "re:.*mlp\\.gate$"}}};
  b.write_json("config.json", cfg);
  const SafetensorsFile f = SafetensorsFile::open(b.dir() + "/model.safetensors");
  std::vector<SafetensorsRawTensor> out;
  for (const auto& e : f.entries()) {
    const auto bytes = f.bytes(e.name);
    const size_t at = e.name.find(".mlp.experts.");
    if (at == std::string::npos) {
      out.push_back({e.name, e.dtype, e.shape, {bytes}});
      continue;
    }
    // model.layers.{i}.mlp.experts.{gate_up_proj|down_proj}_{blocks|scales}
    const std::string prefix = e.name.substr(0, at) + ".mlp.experts.";
    const std::string what = e.name.substr(prefix.size());
    const bool blocks = what.ends_with("_blocks");
    const int64_t E = e.shape[0], N = e.shape[1], row = blocks ? e.shape[2] * 16 : e.shape[2];
    const std::string field = blocks ? ".weight_packed" : ".weight_scale";
    for (int64_t j = 0; j < E; ++j) {
      const auto expert = bytes.subspan(static_cast<size_t>(j * N * row), static_cast<size_t>(N * row));
      const std::string at_j = prefix + std::to_string(j) + ".";
      if (what.starts_with("down_proj")) {
        out.push_back({at_j + "down_proj" + field, "U8", {N, row}, {expert}});
      } else {
        const auto half = static_cast<size_t>(N / 2 * row);
        out.push_back({at_j + "gate_proj" + field, "U8", {N / 2, row}, {expert.first(half)}});
        out.push_back({at_j + "up_proj" + field, "U8", {N / 2, row}, {expert.subspan(half)}});
      }
    }
  }
  save_safetensors_raw(b.dir() + "/model.safetensors", out);
  expect_matches_oracle(b.dir(), "quant-mxfp4", 1e-4);
}

std::string load_error(const std::string& dir) {
  try {
    const Checkpoint ckpt = Checkpoint::open(dir);
    LoadOptions o;
    o.dtype = DType::f32;
    load_model(ckpt, o);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_HAS(text, part) EXPECT_NE((text).find(part), std::string::npos) << "message: " << (text)

TEST(QuantizedModels, MissingScaleTensorIsNamed) {
  BrokenCheckpoint b("quant-fp8");
  b.rewrite([](const std::string& name, auto&, auto&, auto&) {
    return name != "model.layers.0.self_attn.o_proj.weight_scale_inv";
  });
  const std::string msg = load_error(b.dir());
  EXPECT_HAS(msg, "model.layers.0.self_attn.o_proj.weight_scale_inv");
  EXPECT_HAS(msg, "missing");
}

TEST(QuantizedModels, MisshapenScaleTensorIsNamed) {
  BrokenCheckpoint b("quant-nvfp4-modelopt");
  const std::string name = "model.layers.1.mlp.down_proj.weight_scale";  // [160, 96 / 16]
  b.rewrite([&](const std::string& n, auto&, std::vector<int64_t>& shape, std::vector<std::byte>& bytes) {
    if (n == name) {
      shape = {160, 3};
      bytes.resize(160 * 3);
    }
    return true;
  });
  const std::string msg = load_error(b.dir());
  EXPECT_HAS(msg, name);
  EXPECT_HAS(msg, "shape");
}

TEST(QuantizedModels, UnknownQuantMethodIsNamed) {
  BrokenCheckpoint b("quant-fp8");
  nlohmann::json cfg = b.read_json("config.json");
  cfg["quantization_config"]["quant_method"] = "awq";
  b.write_json("config.json", cfg);
  const std::string msg = load_error(b.dir());
  EXPECT_HAS(msg, "quant_method");
  EXPECT_HAS(msg, "awq");
}

// Found by tests/fuzz (quantization_config): a "re:" pattern that does not compile was a std::regex_error
// escaping the loader; it is refused when the config is read, naming the field and the pattern.
TEST(QuantizedModels, BadModulePatternIsNamed) {
  BrokenCheckpoint b("quant-fp8");
  nlohmann::json cfg = b.read_json("config.json");
  cfg["quantization_config"]["modules_to_not_convert"] = {"lm_head", "re:model.(layers"};
  b.write_json("config.json", cfg);
  const std::string msg = load_error(b.dir());
  EXPECT_HAS(msg, "quantization_config: field 'modules_to_not_convert': invalid regex");
  EXPECT_HAS(msg, "model.(layers");
}

// "re:" patterns match whole module names (Oniguruma now, std::regex_match before: the same answers).
TEST(QuantizedModels, ModulePatternsMatchWholeNames) {
  QuantizationConfig q;
  q.source = "config.json: quantization_config";
  q.not_converted = {"re:.*mlp\\.gate", "lm_head", "model.layers.*.self_attn.o_proj"};
  EXPECT_TRUE(q.is_not_converted("model.layers.3.mlp.gate"));
  EXPECT_FALSE(q.is_not_converted("model.layers.3.mlp.gate_proj"));
  EXPECT_FALSE(q.is_not_converted("model.layers.3.mlpxgate"));
  EXPECT_TRUE(q.is_not_converted("lm_head"));
  EXPECT_TRUE(q.is_not_converted("model.layers.0.self_attn.o_proj"));
  EXPECT_FALSE(q.is_not_converted("model.layers.0.self_attn.q_proj"));
}

TEST(QuantizedModels, WrongBlockSizeIsNamed) {
  {
    BrokenCheckpoint b("quant-fp8");
    nlohmann::json cfg = b.read_json("config.json");
    cfg["quantization_config"]["weight_block_size"] = {64, 64};
    b.write_json("config.json", cfg);
    const std::string msg = load_error(b.dir());
    EXPECT_HAS(msg, "weight_block_size");
    EXPECT_HAS(msg, "[64,64]");
  }
  {
    BrokenCheckpoint b("quant-nvfp4-modelopt");
    nlohmann::json cfg = b.read_json("hf_quant_config.json");
    cfg["quantization"]["group_size"] = 32;
    b.write_json("hf_quant_config.json", cfg);
    const std::string msg = load_error(b.dir());
    EXPECT_HAS(msg, "group_size");
    EXPECT_HAS(msg, "hf_quant_config.json");
  }
  {
    BrokenCheckpoint b("quant-nvfp4-ct");
    nlohmann::json cfg = b.read_json("config.json");
    cfg["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] = 32;
    b.write_json("config.json", cfg);
    const std::string msg = load_error(b.dir());
    EXPECT_HAS(msg, "group_size");
    EXPECT_HAS(msg, "group_0");
  }
}

TEST(QuantizedModels, UnconvertedModuleThatIsQuantizedIsNamed) {
  BrokenCheckpoint b("quant-fp8");
  nlohmann::json cfg = b.read_json("config.json");
  cfg["quantization_config"]["modules_to_not_convert"].push_back("self_attn.o_proj");
  b.write_json("config.json", cfg);
  const std::string msg = load_error(b.dir());
  EXPECT_HAS(msg, "model.layers.0.self_attn.o_proj");
  EXPECT_HAS(msg, "not converted");
}

TEST(QuantizedModels, Ue8m0ScalesMustBePowersOfTwo) {
  BrokenCheckpoint b("quant-fp8");  // its scales are amax / 448, not powers of two
  nlohmann::json cfg = b.read_json("config.json");
  cfg["quantization_config"]["scale_fmt"] = "ue8m0";
  b.write_json("config.json", cfg);
  const std::string msg = load_error(b.dir());
  EXPECT_HAS(msg, "weight_scale_inv");
  EXPECT_HAS(msg, "scale_fmt");
}

TEST(QuantizedModels, QuantizedCodesWithoutConfigAreNamed) {
  BrokenCheckpoint b("quant-fp8");
  nlohmann::json cfg = b.read_json("config.json");
  cfg.erase("quantization_config");
  b.write_json("config.json", cfg);
  const std::string msg = load_error(b.dir());
  EXPECT_HAS(msg, "F8_E4M3");
  EXPECT_HAS(msg, "quantization_config");
}

TEST(QuantizedModels, ExpertGateAndUpMustShareTheNvfp4GlobalScale) {
  BrokenCheckpoint b("quant-nvfp4-ct");
  const std::string name = "model.layers.0.mlp.experts.3.up_proj.weight_global_scale";
  b.rewrite([&](const std::string& n, auto&, auto&, std::vector<std::byte>& bytes) {
    if (n == name) {
      float v;
      std::memcpy(&v, bytes.data(), 4);
      v *= 2;
      std::memcpy(bytes.data(), &v, 4);
    }
    return true;
  });
  const std::string msg = load_error(b.dir());
  EXPECT_HAS(msg, "layer 0 expert 3");
  EXPECT_HAS(msg, "global scale");
}

TEST(QuantizedModels, UnsupportedDtypeIsNamed) {
  BrokenCheckpoint b("quant-fp8");
  const std::string name = "model.layers.0.self_attn.o_proj.weight";
  b.rewrite([&](const std::string& n, std::string& dtype, auto&, auto&) {
    if (n == name) dtype = "F8_E5M2";
    return true;
  });
  const std::string msg = load_error(b.dir());
  EXPECT_HAS(msg, name);
  EXPECT_HAS(msg, "F8_E5M2");
}

}  // namespace
}  // namespace xmoe::llm
