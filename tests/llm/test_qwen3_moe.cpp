// Qwen3MoeForCausalLM against transformers (tests/data/models, tools/make_fixtures.py): logits of every
// prompt position and of each greedy decode step through the KV cache, greedy ids, both expert layouts,
// chunked prefill, batched decoding, bf16; plus RoPE frequencies.
#include <gtest/gtest.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "kernels/cpu_features.hpp"
#include "llm/checkpoint.hpp"
#include "llm/layers/rope.hpp"
#include "llm/model.hpp"
#include "llm/model_oracle.hpp"
#include "xmoe/error.hpp"
#include "xmoe/safetensors.hpp"

namespace xmoe::llm {
namespace {

using namespace test;

// The sequence length a RoPE fixture's config was evaluated at (0: none).
int64_t seq_len_of(const std::string& json) {
  return nlohmann::json::parse(json).value("seq_len", int64_t{0});
}

TEST(Qwen3Moe, F32MatchesTransformersPerExpertLayout) {
  expect_matches_oracle("tied-sparse", "tied-sparse", 1e-4);
}

TEST(Qwen3Moe, F32MatchesTransformersFusedShardedLayout) {
  expect_matches_oracle("tied-sparse-fused", "tied-sparse", 1e-4);
}

TEST(Qwen3Moe, F32MatchesTransformersUntiedYarnNoRenormalisation) {
  expect_matches_oracle("untied-yarn", "untied-yarn", 1e-4);
}

TEST(Qwen3Moe, Bf16CheckpointLoadedAsF32MatchesTransformers) {
  expect_matches_oracle("tied-sparse-bf16", "tied-sparse-bf16", 1e-4);
}

TEST(Qwen3Moe, BothExpertLayoutsGiveTheSameBits) {
  Loaded a = load("tied-sparse", DType::f32), b = load("tied-sparse-fused", DType::f32);
  for (const Prompt& p : load_expected("tied-sparse")) {
    const ModelRun ra = run_alone(*a.model, p.ids, 4), rb = run_alone(*b.model, p.ids, 4);
    EXPECT_EQ(ra.prefill, rb.prefill);
    EXPECT_EQ(ra.decode, rb.decode);
  }
}

TEST(Qwen3Moe, ChunkedPrefillGivesTheSameLogits) {
  for (const char* dir : {"tied-sparse", "untied-yarn"}) {
    Loaded l = load(dir, DType::f32);
    const std::vector<int32_t> prompt = load_expected(dir).back().ids;
    const ModelRun whole = run_alone(*l.model, prompt, 3);
    for (size_t chunk : {1, 3, 7}) {
      const ModelRun r = run_alone(*l.model, prompt, 3, chunk);
      EXPECT_EQ(r.prefill, whole.prefill) << dir << " chunk " << chunk;
      EXPECT_EQ(r.decode, whole.decode) << dir << " chunk " << chunk;
    }
  }
}

// Prompts of different lengths prefilled together in one step, then decoded together (sequences joining
// late and leaving early too): each sequence's logits are bit-identical to running it alone.
TEST(Qwen3Moe, BatchedDecodingEqualsDecodingAlone) {
  for (DType dtype : {DType::f32, DType::bf16}) {
    Loaded l = load("tied-sparse", dtype);
    CausalLM& m = *l.model;
    const int64_t V = m.config().vocab_size;
    const std::vector<Prompt> prompts = load_expected("tied-sparse");
    const int steps = 6;
    std::vector<ModelRun> alone;
    for (const Prompt& p : prompts) alone.push_back(run_alone(m, p.ids, steps));

    KvCache cache(m.kv_cache_shape(), m.dtype(), kCacheBudget, 4);
    std::vector<SequenceId> seqs;
    std::vector<std::vector<int32_t>> generated(prompts.size());
    std::vector<int> decoded(prompts.size(), 0);
    // Sequence 2 joins one step late (its prefill shares a step with the others' decode).
    std::vector<bool> prefilled(prompts.size(), false);
    for (size_t i = 0; i < prompts.size(); ++i) {
      seqs.push_back(cache.create_sequence());
      ASSERT_TRUE(cache.reserve(seqs[i], static_cast<int64_t>(prompts[i].ids.size()) + steps));
    }
    std::vector<float> logits;
    for (int round = 0; round <= steps + 1; ++round) {
      std::vector<SequenceChunk> batch;
      std::vector<size_t> who;
      for (size_t i = 0; i < prompts.size(); ++i) {
        if (i == 2 && round == 0) continue;
        if (!prefilled[i]) {
          batch.push_back({seqs[i], prompts[i].ids, true});
        } else if (decoded[i] < steps) {
          batch.push_back({seqs[i], std::span<const int32_t>(&generated[i].back(), 1), false});
        } else {
          continue;
        }
        who.push_back(i);
      }
      if (batch.empty()) break;
      m.forward(batch, cache, logits);
      size_t row = 0;
      for (size_t b = 0; b < batch.size(); ++b) {
        const size_t i = who[b];
        if (!prefilled[i]) {
          const size_t n = prompts[i].ids.size();
          EXPECT_TRUE(
              std::equal(logits.begin() + row * V, logits.begin() + (row + n) * V, alone[i].prefill.begin()))
              << "prefill of prompt " << i;
          row += n;
          prefilled[i] = true;
          generated[i].push_back(alone[i].greedy[0]);
          EXPECT_EQ(argmax(alone[i].prefill.data() + (n - 1) * V, V), alone[i].greedy[0]);
        } else {
          const int s = decoded[i]++;
          EXPECT_TRUE(std::equal(logits.begin() + row * V, logits.begin() + (row + 1) * V,
                                 alone[i].decode.begin() + s * V))
              << "decode step " << s << " of prompt " << i;
          generated[i].push_back(argmax(logits.data() + row * V, V));
          ++row;
        }
      }
      EXPECT_EQ(row * V, logits.size());
    }
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(decoded[i], steps);
      generated[i].pop_back();  // the token after the last step was never fed
      EXPECT_EQ(generated[i], alone[i].greedy) << "prompt " << i;
      cache.release(seqs[i]);
    }
    EXPECT_EQ(cache.free_blocks(), cache.total_blocks());
  }
}

TEST(Qwen3Moe, ResultsDoNotDependOnTheThreadCount) {
  Loaded l = load("untied-yarn", DType::bf16);
  const std::vector<int32_t> prompt = load_expected("untied-yarn").back().ids;
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const ModelRun one = run_alone(*l.model, prompt, 3);
  omp_set_num_threads(3);
  const ModelRun three = run_alone(*l.model, prompt, 3);
  omp_set_num_threads(saved);
  EXPECT_EQ(one.prefill, three.prefill);
  EXPECT_EQ(one.decode, three.decode);
}

// transformers in bf16 rounds every activation to bf16 (8 significant bits) where we keep f32 between the
// bf16 weight products, so the two differ by a few bf16 roundings per layer: 3e-2 of the row's largest logit
// (measured: about 1e-2). Our bf16 path against our own f32 run on the same weights is tighter, since only
// the KV cache is rounded (the bf16 weights are read in place, activations stay f32): 1e-2.
TEST(Qwen3Moe, Bf16PathMatchesTransformersInBf16) {
  Loaded b16 = load("tied-sparse-bf16", DType::bf16), f32 = load("tied-sparse-bf16", DType::f32);
  const int64_t V = b16.model->config().vocab_size;
  double worst_hf = 0, worst_ours = 0;
  for (const Prompt& p : load_expected("tied-sparse-bf16")) {
    const int steps = static_cast<int>(p.greedy.size());
    const ModelRun r = run_alone(*b16.model, p.ids, steps), r32 = run_alone(*f32.model, p.ids, steps);
    EXPECT_EQ(r.greedy, p.greedy);
    for (size_t t = 0; t < p.ids.size(); ++t) {
      worst_hf = std::max(worst_hf, row_error(r.prefill.data() + t * V, p.prefill_bf16.data() + t * V, V));
      worst_ours = std::max(worst_ours, row_error(r.prefill.data() + t * V, r32.prefill.data() + t * V, V));
    }
    for (int s = 0; s < steps; ++s) {
      worst_hf = std::max(worst_hf, row_error(r.decode.data() + s * V, p.decode_bf16.data() + s * V, V));
      worst_ours = std::max(worst_ours, row_error(r.decode.data() + s * V, r32.decode.data() + s * V, V));
    }
  }
  EXPECT_LT(worst_hf, 3e-2);
  EXPECT_LT(worst_ours, 1e-2);
  EXPECT_GT(worst_ours, 0.0);  // the bf16 path really ran in bf16
  std::printf("bf16 vs transformers bf16: %.3g, bf16 vs our f32: %.3g (max |diff| / max |ref|)\n", worst_hf,
              worst_ours);
}

TEST(Qwen3Moe, LowerKernelLevelsAgreeWithTheBest) {
  Loaded fast = load("untied-yarn", DType::f32);
  const std::vector<int32_t> prompt = load_expected("untied-yarn")[1].ids;
  const ModelRun a = run_alone(*fast.model, prompt, 3);
  const int64_t V = fast.model->config().vocab_size;
  const kernels::CpuFeatures features = kernels::detect_cpu_features();
  for (const char* isa : {"reference", "avx2"}) {
    if (!kernels::isa_supported(features, kernels::parse_isa(isa))) continue;
    Loaded other = load("untied-yarn", DType::f32, isa);
    const ModelRun b = run_alone(*other.model, prompt, 3);
    ASSERT_EQ(a.greedy, b.greedy) << isa;
    for (size_t r = 0; r < a.prefill.size() / V; ++r)
      EXPECT_LT(row_error(a.prefill.data() + r * V, b.prefill.data() + r * V, V), 1e-5) << isa;
    for (size_t r = 0; r < a.decode.size() / V; ++r)
      EXPECT_LT(row_error(a.decode.data() + r * V, b.decode.data() + r * V, V), 1e-5) << isa;
  }
}

TEST(Qwen3Moe, WeightBytesPerToken) {
  Loaded l = load("tied-sparse", DType::bf16);
  const ModelConfig& c = l.model->config();
  // tied-sparse: 3 layers (sparse, dense, sparse), hidden 64, 4 heads / 2 kv heads of 16, 8 experts, k 2,
  // expert FFN 16, dense FFN 48, vocab 256.
  const size_t H = 64, D = 16, attn = (4 * D + 2 * 2 * D) * H + H * 4 * D, norms = (2 * H + 2 * D) * 4;
  const size_t sparse = attn + 8 * H + 2 * 3 * 16 * H, dense = attn + 3 * 48 * H;
  const size_t expected = 2 * (H + 256 * H + 2 * sparse + dense) + 3 * norms + H * 4;
  ASSERT_EQ(c.num_hidden_layers, 3);
  EXPECT_EQ(l.model->weight_bytes_per_token(), expected);
}

// A step reads every matrix once and each MoE layer's chosen experts once, however many tokens chose them.
TEST(Qwen3Moe, WeightBytesReadCountsEachChosenExpertOnce) {
  Loaded l = load("tied-sparse", DType::bf16);
  CausalLM& m = *l.model;
  const size_t H = 64, row = 2 * H, expert = 2 * 3 * 16 * H, per_token = m.weight_bytes_per_token();
  const size_t without_experts = per_token - row - 2 * 2 * expert;  // 2 sparse layers, k = 2
  KvCache cache(m.kv_cache_shape(), m.dtype(), kCacheBudget, 4);
  std::vector<float> logits;
  auto step_bytes = [&](const std::vector<std::vector<int32_t>>& prompts) {
    std::vector<SequenceChunk> batch;
    for (const auto& p : prompts) {
      const SequenceId seq = cache.create_sequence();
      EXPECT_TRUE(cache.reserve(seq, static_cast<int64_t>(p.size())));
      batch.push_back({seq, p, false});
    }
    const uint64_t before = m.weight_bytes_read();
    m.forward(batch, cache, logits);
    return m.weight_bytes_read() - before;
  };
  // One token: exactly the per-token figure (its k experts are distinct).
  EXPECT_EQ(step_bytes({{7}}), per_token);
  // Two sequences of the same first token route identically: one more embedding row, no more experts.
  EXPECT_EQ(step_bytes({{7}, {7}}), per_token + row);
  // Many different tokens choose more experts, but never more than all 8 of a layer.
  std::vector<int32_t> many;
  for (int32_t t = 0; t < 40; ++t) many.push_back(t * 5 + 1);
  const uint64_t b = step_bytes({many});
  EXPECT_GT(b, per_token + 39 * row);
  EXPECT_LE(b, without_experts + 40 * row + 2 * 8 * expert);
}

TEST(Qwen3Moe, BadInputThrowsNamingIt) {
  Loaded l = load("tied-sparse", DType::f32);
  CausalLM& m = *l.model;
  KvCache cache(m.kv_cache_shape(), m.dtype(), kCacheBudget, 4);
  const SequenceId seq = cache.create_sequence();
  ASSERT_TRUE(cache.reserve(seq, 4));
  std::vector<float> logits;
  auto message = [&](std::vector<int32_t> tokens) {
    const SequenceChunk c{seq, tokens, false};
    try {
      m.forward(std::span(&c, 1), cache, logits);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({1, 256}).find("token id 256"), std::string::npos);
  EXPECT_NE(message({1, -1}).find("token id -1"), std::string::npos);
  EXPECT_NE(message({1, 2, 3, 4, 5}).find("reserve first"), std::string::npos);
  EXPECT_NE(message({}).find("no new tokens"), std::string::npos);
  EXPECT_EQ(cache.length(seq), 0);  // nothing was written
  EXPECT_EQ(message({1, 2}), "no error");
  EXPECT_EQ(cache.length(seq), 2);

  KvCache wrong(KvCacheShape{2, 2, 16}, DType::f32, kCacheBudget, 4);
  const SequenceId s2 = wrong.create_sequence();
  ASSERT_TRUE(wrong.reserve(s2, 4));
  const std::vector<int32_t> tokens{1};
  const SequenceChunk c{s2, tokens, false};
  EXPECT_THROW(m.forward(std::span(&c, 1), wrong, logits), Error);
}

TEST(Qwen3Moe, MissingTensorAndUnknownArchitectureAreNamed) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / (std::string("xmoe_qwen3_bad_").append(std::to_string(::getpid())));
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy_file(kModels + "/tied-sparse/config.json", dir / "config.json");
  // The weights minus one expert tensor.
  const SafetensorsFile src = SafetensorsFile::open(kModels + "/tied-sparse/model.safetensors");
  std::vector<std::pair<std::string, Tensor>> kept;
  for (const auto& e : src.entries())
    if (e.name != "model.layers.2.mlp.experts.5.up_proj.weight")
      kept.emplace_back(e.name, src.tensor(e.name));
  save_safetensors((dir / "model.safetensors").string(), kept);
  try {
    const Checkpoint ck = Checkpoint::open(dir.string());
    load_model(ck, LoadOptions{DType::f32, "", nullptr});
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.2.mlp.experts.5.up_proj.weight"), std::string::npos)
        << e.what();
  }
  fs::remove_all(dir);
}

// RoPE inverse frequencies and attention scaling as transformers computes them.
TEST(Rope, FrequenciesMatchTransformers) {
  const SafetensorsFile f = SafetensorsFile::open(kModels + "/rope.expected.safetensors");
  int cases = 0;
  for (int i = 0; f.contains(std::string("rope").append(std::to_string(i)) + ".inv_freq"); ++i, ++cases) {
    const std::string p = std::string("rope").append(std::to_string(i)) + ".";
    const std::string json = f.metadata().at(p + "config");
    const ModelConfig cfg = parse_model_config_text(json, p + "config");
    const Rope rope(cfg);
    const std::vector<float> want = read_f32(f, p + "inv_freq");
    const float scaling = read_f32(f, p + "attention_scaling")[0];
    const int64_t seq_len = seq_len_of(json);
    // Rotating the unit vector e_j at position 1 exposes cos/sin of inv_freq_j (times the scaling).
    const int D = cfg.head_dim;
    for (int j = 0; j < D / 2; ++j) {
      std::vector<float> v(static_cast<size_t>(D), 0.0f);
      v[static_cast<size_t>(j)] = 1.0f;
      const int64_t pos = seq_len > 0 ? seq_len - 1 : 1;
      rope.apply(v.data(), 1, pos, seq_len > 0 ? seq_len : 2);
      const double angle = static_cast<double>(static_cast<float>(pos) * want[static_cast<size_t>(j)]);
      EXPECT_NEAR(v[static_cast<size_t>(j)], std::cos(angle) * scaling, 2e-6 * std::max(1.0, std::abs(angle)))
          << "case " << i << " j " << j;
      EXPECT_NEAR(v[static_cast<size_t>(j + D / 2)], std::sin(angle) * scaling,
                  2e-6 * std::max(1.0, std::abs(angle)))
          << "case " << i << " j " << j;
      if (seq_len == 0) {
        EXPECT_NEAR(rope.inv_freq()[static_cast<size_t>(j)], want[static_cast<size_t>(j)],
                    2e-7 * want[static_cast<size_t>(j)])
            << "case " << i << " j " << j;
      }
    }
    EXPECT_FLOAT_EQ(rope.attention_scaling(), scaling) << "case " << i;
  }
  EXPECT_EQ(cases, 6);
}

}  // namespace
}  // namespace xmoe::llm
