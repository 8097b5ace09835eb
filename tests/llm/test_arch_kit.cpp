// The architecture kit's parts against transformers (tools/make_arch_kit_fixtures.py → tests/data/arch_kit):
// RoPE variants (default, linear, YaRN with truncate on/off, attention_factor, mscale pair, llama3, partial
// rotary) from config.json through the shared parser, the attention block (GQA, q/k/v/o biases, learned
// sinks, sliding window and full layers, YaRN) fed whole, in chunks, batched and one token at a time through
// the per-layer KV cache, and the registry / per-layer config parsing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "kernels/kernels.hpp"
#include "llm/arch/architecture.hpp"
#include "llm/arch/attention_block.hpp"
#include "llm/arch/config_fields.hpp"
#include "llm/kv_cache.hpp"
#include "llm/layers/rmsnorm.hpp"
#include "llm/layers/rope.hpp"
#include "xmoe/error.hpp"

namespace xmoe::llm {
namespace {

using json = nlohmann::json;

json load(const std::string& file) {
  std::ifstream in(std::string(XMOE_TEST_DATA_DIR) + "/arch_kit/" + file);
  EXPECT_TRUE(in.good()) << file;
  return json::parse(in);
}

std::vector<float> floats(const json& j) {
  return j.get<std::vector<float>>();
}

// The shared decoder fields of a config.json fragment, as an architecture's parse_config reads them.
ModelConfig parse_fields(const json& config) {
  const FieldReader r(config, "fixture/config.json");
  ModelConfig c;
  parse_decoder_fields(r, DecoderDefaults{}, c);
  parse_layer_types(r, c);
  return c;
}

// rms_norm_rows runs several rows' sums side by side; each row must get the bits of the plain one-row loop
// (sum of squares in double in index order), for any row count, stride and in place.
TEST(ArchKitRmsNorm, RowsTogetherGiveThePlainLoopsBits) {
  std::mt19937 gen(3);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (const int64_t dim : {1, 7, 128, 2048})
    for (const int64_t rows : {1, 3, 8, 9, 19}) {
      SCOPED_TRACE(testing::Message() << dim << " values x " << rows << " rows");
      const int64_t stride = dim + 5;
      std::vector<float> x(static_cast<size_t>(rows * stride)), w(static_cast<size_t>(dim));
      for (float& v : x) v = normal(gen);
      for (float& v : w) v = normal(gen);
      std::vector<float> want = x;
      for (int64_t r = 0; r < rows; ++r) {
        const float* in = x.data() + r * stride;
        double ss = 0;
        for (int64_t i = 0; i < dim; ++i) ss += static_cast<double>(in[i]) * in[i];
        const float scale = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(dim)) + 1e-6f);
        for (int64_t i = 0; i < dim; ++i)
          want[static_cast<size_t>(r * stride + i)] = w[static_cast<size_t>(i)] * (in[i] * scale);
      }
      std::vector<float> out = x;
      rms_norm_rows(x.data(), out.data(), rows, dim, stride, w.data(), 1e-6f);
      EXPECT_EQ(std::memcmp(out.data(), want.data(), out.size() * sizeof(float)), 0);
      rms_norm_rows(x.data(), x.data(), rows, dim, stride, w.data(), 1e-6f);
      EXPECT_EQ(std::memcmp(x.data(), want.data(), x.size() * sizeof(float)), 0) << "in place";
    }
}

TEST(ArchKitRope, InverseFrequenciesAttentionFactorAndRotationMatchTransformers) {
  const json fixture = load("rope.json");
  ASSERT_GE(fixture["cases"].size(), 7u);
  for (const json& tc : fixture["cases"]) {
    SCOPED_TRACE(tc["name"].get<std::string>());
    const ModelConfig c = parse_fields(tc["config"]);
    EXPECT_EQ(c.rotary_dim, tc["rotary_dim"].get<int>());
    const Rope rope(c);
    const std::vector<float> want_inv = floats(tc["inv_freq"]);
    ASSERT_EQ(rope.inv_freq().size(), want_inv.size());
    for (size_t i = 0; i < want_inv.size(); ++i)
      EXPECT_NEAR(rope.inv_freq()[i], want_inv[i], 2e-7 * std::abs(want_inv[i])) << "i=" << i;
    EXPECT_NEAR(rope.attention_scaling(), tc["attention_factor"].get<double>(), 1e-6);

    const int heads = tc["heads"].get<int>(), D = c.head_dim;
    const std::vector<int64_t> positions = tc["positions"].get<std::vector<int64_t>>();
    std::vector<float> x = floats(tc["x"]);
    const std::vector<float> want = floats(tc["rotated"]);
    for (size_t p = 0; p < positions.size(); ++p) {
      float* row = x.data() + p * static_cast<size_t>(heads * D);
      rope.apply(row, heads, positions[p], positions[p] + 1);
      for (int i = 0; i < heads * D; ++i) {
        const float w = want[p * static_cast<size_t>(heads * D) + static_cast<size_t>(i)];
        // cos/sin of angles up to ~9000 rad in f32: torch and libm differ by a few ulp of the angle.
        EXPECT_NEAR(row[i], w, 2e-4 + 2e-4 * std::abs(w)) << "position " << positions[p] << " i=" << i;
      }
    }
  }
}

kernels::PackedWeight f32_matrix(const std::vector<float>& v, int64_t rows, int64_t cols) {
  EXPECT_EQ(static_cast<int64_t>(v.size()), rows * cols);
  kernels::PackedWeight w;
  w.format = kernels::WeightFormat::f32;
  w.rows = rows;
  w.cols = cols;
  w.data = reinterpret_cast<const std::byte*>(v.data());
  w.row_bytes = cols * static_cast<int64_t>(sizeof(float));
  return w;
}

// The fixture's two attention layers (sliding, full) over one shared KV cache.
struct AttentionCase {
  json fixture = load("attention.json");
  ModelConfig config = parse_fields(fixture["config"]);
  int64_t T = fixture["tokens"].get<int64_t>(), H = config.hidden_size;
  std::vector<float> x = floats(fixture["x"]);
  std::vector<std::vector<float>> storage;  // the weights the views point into
  std::vector<AttentionBlock> blocks;
  KvCacheShape shape{2, config.num_key_value_heads, config.head_dim, {}};

  AttentionCase() {
    const int64_t q = int64_t{config.num_attention_heads} * config.head_dim;
    const int64_t kv = int64_t{config.num_key_value_heads} * config.head_dim;
    storage.reserve(8);
    for (const json& L : fixture["layers"]) {
      auto keep = [&](const char* key) -> const std::vector<float>& {
        storage.push_back(floats(L[key]));
        return storage.back();
      };
      AttentionOptions options;
      options.qkv_bias = options.o_bias = options.sinks = true;
      AttentionWeights w;
      w.q = f32_matrix(keep("q_weight"), q, H);
      w.k = f32_matrix(keep("k_weight"), kv, H);
      w.v = f32_matrix(keep("v_weight"), kv, H);
      w.o = f32_matrix(keep("o_weight"), H, q);
      w.q_bias = floats(L["q_bias"]);
      w.k_bias = floats(L["k_bias"]);
      w.v_bias = floats(L["v_bias"]);
      w.o_bias = floats(L["o_bias"]);
      w.sinks = floats(L["sinks"]);
      const int64_t window = L["window"].get<int64_t>();
      shape.layer_window.push_back(window);
      blocks.emplace_back(options, config.num_attention_heads, config.num_key_value_heads, config.head_dim,
                          window, 1e-5f, std::move(w));
    }
  }
  std::vector<float> want(size_t layer) const { return floats(fixture["layers"][layer]["out"]); }
};

// Runs steps; each step lists (sequence index, new tokens) and feeds rows of x from each sequence's length.
// Returns out[layer][sequence] rows [T, H] as produced.
std::vector<std::vector<std::vector<float>>> run_steps(
    AttentionCase& ac, const std::vector<std::vector<std::pair<int, int64_t>>>& steps, int sequences,
    DType dtype = DType::f32) {
  const kernels::KernelTable& table = kernels::best_kernel_table(kernels::detect_cpu_features());
  const Rope rope(ac.config);
  KvCache cache(ac.shape, dtype, 1 << 20, 4);
  std::vector<SequenceId> ids;
  for (int s = 0; s < sequences; ++s) ids.push_back(cache.create_sequence());
  const int64_t H = ac.H;
  std::vector<std::vector<std::vector<float>>> out(
      2, std::vector<std::vector<float>>(static_cast<size_t>(sequences),
                                         std::vector<float>(static_cast<size_t>(ac.T * H))));
  AttentionScratch scratch;
  for (const auto& step_spec : steps) {
    StepRows step;
    step.first.push_back(0);
    std::vector<float> x;
    for (const auto& [s, n] : step_spec) {
      const SequenceId id = ids[static_cast<size_t>(s)];
      const int64_t start = cache.length(id);
      EXPECT_LE(start + n, ac.T);
      EXPECT_TRUE(cache.reserve(id, start + n));
      step.seq.push_back(id);
      step.start.push_back(start);
      step.first.push_back(step.first.back() + n);
      x.insert(x.end(), ac.x.begin() + start * H, ac.x.begin() + (start + n) * H);
    }
    for (size_t c = 0; c < step.seq.size(); ++c)
      for (int64_t t = step.first[c]; t < step.first[c + 1]; ++t)
        step.chunk_of.push_back(static_cast<int64_t>(c));
    std::vector<float> y(x.size());
    for (int layer = 0; layer < 2; ++layer) {
      ac.blocks[static_cast<size_t>(layer)].forward(table, rope, step, cache, layer, x.data(), y.data(),
                                                    scratch);
      for (size_t c = 0; c < step.seq.size(); ++c) {
        const int s = step_spec[c].first;
        std::copy(y.begin() + step.first[c] * H, y.begin() + step.first[c + 1] * H,
                  out[static_cast<size_t>(layer)][static_cast<size_t>(s)].begin() + step.start[c] * H);
      }
    }
    for (size_t c = 0; c < step.seq.size(); ++c)
      cache.set_length(step.seq[c], step.start[c] + step.first[c + 1] - step.first[c]);
  }
  return out;
}

void expect_rows(const std::vector<float>& got, const std::vector<float>& want, double tol,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(got[i], want[i], tol * (1 + std::abs(want[i]))) << what << " element " << i;
}

TEST(ArchKitAttention, SinksWindowBiasesGqaYarnMatchTransformersWholeChunkedAndDecoded) {
  AttentionCase ac;
  ASSERT_EQ(ac.shape.layer_window, (std::vector<int64_t>{5, 0}));
  ASSERT_GT(ac.T, 2 * ac.shape.layer_window[0]);  // the window matters, and decode runs far past it
  // Prefill 3 tokens, then decode one at a time to the end (10 steps, far past the window).
  std::vector<std::vector<std::pair<int, int64_t>>> decode = {{{0, 3}}};
  while (static_cast<int64_t>(decode.size()) + 2 < ac.T) decode.push_back({{0, 1}});
  const std::vector<std::vector<std::vector<std::pair<int, int64_t>>>> schedules = {
      {{{0, ac.T}}},  // the whole sequence at once (in passes of max_append)
      decode,
      {{{0, 7}, {1, 2}}, {{1, 9}, {0, 6}}, {{1, 2}}},  // two sequences batched, uneven chunks
  };
  for (size_t s = 0; s < schedules.size(); ++s) {
    const int sequences = s == 2 ? 2 : 1;
    const auto out = run_steps(ac, schedules[s], sequences);
    for (size_t layer = 0; layer < 2; ++layer)
      for (int q = 0; q < sequences; ++q)
        expect_rows(out[layer][static_cast<size_t>(q)], ac.want(layer), 2e-5,
                    "schedule " + std::to_string(s) + " layer " + std::to_string(layer) + " seq " +
                        std::to_string(q));
  }
}

TEST(ArchKitAttention, Bf16CacheGivesTheSameRowsForAnyChunkingAndStaysNearTheOracle) {
  AttentionCase ac;
  const auto whole = run_steps(ac, {{{0, ac.T}}}, 1, DType::bf16);
  const auto chunked = run_steps(ac, {{{0, 4}}, {{0, 1}}, {{0, 8}}}, 1, DType::bf16);
  for (size_t layer = 0; layer < 2; ++layer) {
    // Each row's arithmetic depends only on its own inputs and the cached (rounded) K/V: bit-identical.
    EXPECT_EQ(whole[layer][0], chunked[layer][0]) << "layer " << layer;
    // bf16 K/V move these sharp softmaxes (|logits| of tens) by a few percent of the output's scale.
    const std::vector<float> want = ac.want(layer);
    float scale = 0;
    for (float w : want) scale = std::max(scale, std::abs(w));
    for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(whole[layer][0][i], want[i], 0.05 * scale) << i;
  }
}

TEST(ArchKitAttention, WindowMismatchWithTheCacheIsAnError) {
  AttentionCase ac;
  const kernels::KernelTable& table = kernels::best_kernel_table(kernels::detect_cpu_features());
  KvCache cache(KvCacheShape{2, ac.config.num_key_value_heads, ac.config.head_dim, {}}, DType::f32, 1 << 20,
                4);
  StepRows step{{cache.create_sequence()}, {0, 1}, {0}, {0}};
  cache.reserve(step.seq[0], 1);
  std::vector<float> y(static_cast<size_t>(ac.H));
  AttentionScratch scratch;
  try {
    ac.blocks[0].forward(table, Rope(ac.config), step, cache, 0, ac.x.data(), y.data(), scratch);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("window"), std::string::npos) << e.what();
  }
}

TEST(ArchKitKvCache, SlidingLayersKeepOnlyARing) {
  // 4 layers alternating sliding (window 6) / full, blocks of 4 tokens: a ring of ceil(5/4) + 1 = 3 blocks.
  const KvCacheShape shape{4, 2, 8, {6, 0, 6, 0}};
  KvCache cache(shape, DType::f32, 100 * 2 * 2 * 4 * 2 * 8 * 4, 4);
  EXPECT_EQ(cache.bytes_per_block(), size_t{2} * 2 * 4 * 2 * 8 * 4);  // two layers of a kind per block
  EXPECT_EQ(cache.ring_blocks(), 3);
  EXPECT_EQ(cache.max_append(0), 3 * 4 - 6 + 1);
  const SequenceId s = cache.create_sequence();
  ASSERT_TRUE(cache.reserve(s, 5));
  EXPECT_EQ(cache.block_table(s).size(), 2u);
  EXPECT_EQ(cache.ring_table(s).size(), 2u);
  EXPECT_FALSE(cache.reserve(s, 4 * 98));  // 98 + 3 blocks > 100
  ASSERT_TRUE(cache.reserve(s, 4 * 97));
  EXPECT_EQ(cache.block_table(s).size(), 97u);
  EXPECT_EQ(cache.ring_table(s).size(), 3u);  // however long the sequence
  EXPECT_EQ(cache.blocks_for(4 * 97), 100);
  EXPECT_EQ(cache.max_tokens(), 4 * 97);
  EXPECT_EQ(cache.free_blocks(), 0);
  // Position p of a sliding layer lives in ring block (p / 4) mod 3.
  EXPECT_EQ(cache.block_of(s, 0, 0), cache.block_of(s, 0, 12));
  EXPECT_NE(cache.block_of(s, 1, 0), cache.block_of(s, 1, 12));
  cache.release(s);
  EXPECT_EQ(cache.free_blocks(), cache.total_blocks());
  EXPECT_THROW(KvCache(KvCacheShape{4, 2, 8, {6, 0}}, DType::f32, 1 << 20, 4), Error);
}

TEST(ArchKitConfig, LayerTypesAndPartialRotary) {
  json j = {{"num_hidden_layers", 4},
            {"hidden_size", 64},
            {"num_attention_heads", 4},
            {"num_key_value_heads", 2},
            {"sliding_window", 128},
            {"partial_rotary_factor", 0.25},
            {"layer_types", {"sliding_attention", "full_attention", "sliding_attention", "full_attention"}}};
  ModelConfig c = parse_fields(j);
  EXPECT_EQ(c.rotary_dim, 4);
  EXPECT_EQ(c.attention_window(0), 128);
  EXPECT_EQ(c.attention_window(1), 0);
  EXPECT_EQ(c.attention_window(2), 128);
  auto error = [](const json& bad) {
    try {
      parse_fields(bad);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  json bad = j;
  bad["layer_types"] = {"sliding_attention"};
  EXPECT_NE(error(bad).find("field 'layer_types' has 1 entries but num_hidden_layers = 4"), std::string::npos)
      << error(bad);
  bad = j;
  bad["layer_types"][2] = "chunked_attention";
  EXPECT_NE(error(bad).find("field 'layer_types'[2] = 'chunked_attention' is not supported"),
            std::string::npos)
      << error(bad);
  bad = j;
  bad.erase("sliding_window");
  EXPECT_NE(error(bad).find("field 'sliding_window' must be >= 1"), std::string::npos) << error(bad);
  bad = j;
  bad["partial_rotary_factor"] = 0.1;  // 16 · 0.1 → 1: odd
  EXPECT_NE(error(bad).find("partial_rotary_factor"), std::string::npos) << error(bad);
  bad = j;
  bad["partial_rotary_factor"] = 1.5;
  EXPECT_NE(error(bad).find("must be in (0, 1]"), std::string::npos) << error(bad);
}

TEST(ArchKitRegistry, FindsArchitecturesByNameAndModelType) {
  ASSERT_FALSE(architectures().empty());
  for (const Architecture* a : architectures()) {
    EXPECT_EQ(find_architecture(a->name()), a);
    EXPECT_EQ(find_architecture_by_model_type(a->model_type()), a);
    EXPECT_NE(supported_architecture_names().find(std::string(a->name())), std::string::npos);
  }
  EXPECT_EQ(find_architecture("NoSuchForCausalLM"), nullptr);
  const ModelConfig c = parse_model_config_text(R"({"model_type": "qwen3_moe"})", "config.json");
  EXPECT_EQ(&architecture_of(c), find_architecture("Qwen3MoeForCausalLM"));
  // The name map: every tensor init-model writes for Qwen3-MoE is a distinct name.
  const std::vector<PlannedTensor> plan = architecture_of(c).tensors(c, ExpertLayout::per_expert);
  std::vector<std::string> names;
  for (const PlannedTensor& t : plan) names.push_back(t.name);
  std::sort(names.begin(), names.end());
  EXPECT_EQ(std::adjacent_find(names.begin(), names.end()), names.end());
}

}  // namespace
}  // namespace xmoe::llm
