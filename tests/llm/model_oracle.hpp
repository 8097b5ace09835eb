// Running a tiny model against transformers' logits (tools/make_fixtures.py and
// tools/make_quant_model_fixtures.py write tests/data/models/<name>.expected.safetensors): prefill logits of
// every prompt position, greedy decode steps through the KV cache, greedy ids.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "llm/checkpoint.hpp"
#include "llm/kv_cache.hpp"
#include "llm/model.hpp"
#include "xmoe/safetensors.hpp"

namespace xmoe::llm::test {

inline const std::string kModels = std::string(XMOE_TEST_DATA_DIR) + "/models";
inline constexpr size_t kCacheBudget = 4 << 20;

struct Prompt {
  std::vector<int32_t> ids, greedy;
  std::vector<float> prefill, decode, prefill_bf16, decode_bf16;  // rows of vocab_size
};

inline std::vector<int32_t> read_i32(const SafetensorsFile& f, const std::string& name) {
  const auto bytes = f.bytes(name);
  std::vector<int32_t> out(bytes.size() / 4);
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

inline std::vector<float> read_f32(const SafetensorsFile& f, const std::string& name) {
  const Tensor t = f.tensor(name);
  return std::vector<float>(t.data<float>(), t.data<float>() + t.numel());
}

inline std::vector<Prompt> load_expected(const std::string& name) {
  const SafetensorsFile f = SafetensorsFile::open(kModels + "/" + name + ".expected.safetensors");
  std::vector<Prompt> prompts;
  for (int i = 0; f.contains(std::string("p").append(std::to_string(i)) + ".prompt"); ++i) {
    const std::string p = std::string("p").append(std::to_string(i)) + ".";
    Prompt pr;
    pr.ids = read_i32(f, p + "prompt");
    pr.greedy = read_i32(f, p + "greedy");
    pr.prefill = read_f32(f, p + "prefill");
    pr.decode = read_f32(f, p + "decode");
    if (f.contains(p + "prefill_bf16")) {
      pr.prefill_bf16 = read_f32(f, p + "prefill_bf16");
      pr.decode_bf16 = read_f32(f, p + "decode_bf16");
    }
    prompts.push_back(std::move(pr));
  }
  return prompts;
}

struct Loaded {
  Checkpoint ckpt;
  std::unique_ptr<CausalLM> model;
};

// dir: a fixture under tests/data/models, or an absolute path.
inline Loaded load(const std::string& dir, DType dtype, const std::string& isa = "") {
  Loaded l{Checkpoint::open(dir.starts_with("/") ? dir : kModels + "/" + dir), nullptr};
  LoadOptions o;
  o.dtype = dtype;
  o.isa = isa;
  l.model = load_model(l.ckpt, o);
  return l;
}

// max |a − b| / max |b| over one row.
inline double row_error(const float* a, const float* b, int64_t n) {
  double diff = 0, ref = 0;
  for (int64_t i = 0; i < n; ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    ref = std::max(ref, std::abs(static_cast<double>(b[i])));
  }
  return diff / ref;
}

inline int32_t argmax(const float* x, int64_t n) {
  return static_cast<int32_t>(std::max_element(x, x + n) - x);
}

// Our run of one prompt: prefill logits of every position (in chunks of `chunk` tokens, 0 = all at once),
// then greedy decode steps feeding our own argmax.
struct ModelRun {
  std::vector<float> prefill, decode;
  std::vector<int32_t> greedy;
};

inline ModelRun run_alone(CausalLM& model, const std::vector<int32_t>& prompt, int steps, size_t chunk = 0) {
  KvCache cache(model.kv_cache_shape(), model.dtype(), kCacheBudget, 4);
  const SequenceId seq = cache.create_sequence();
  EXPECT_TRUE(cache.reserve(seq, static_cast<int64_t>(prompt.size()) + steps));
  const int64_t V = model.config().vocab_size;
  ModelRun r;
  std::vector<float> logits;
  const size_t step = chunk ? chunk : prompt.size();
  for (size_t i = 0; i < prompt.size(); i += step) {
    const size_t n = std::min(step, prompt.size() - i);
    const SequenceChunk c{seq, std::span<const int32_t>(prompt.data() + i, n), true};
    model.forward(std::span(&c, 1), cache, logits);
    r.prefill.insert(r.prefill.end(), logits.begin(), logits.end());
  }
  int32_t next = argmax(r.prefill.data() + (prompt.size() - 1) * V, V);
  for (int s = 0; s < steps; ++s) {
    r.greedy.push_back(next);
    const SequenceChunk c{seq, std::span<const int32_t>(&r.greedy.back(), 1), false};
    model.forward(std::span(&c, 1), cache, logits);
    EXPECT_EQ(logits.size(), static_cast<size_t>(V));
    r.decode.insert(r.decode.end(), logits.begin(), logits.end());
    next = argmax(logits.data(), V);
  }
  EXPECT_EQ(cache.length(seq), static_cast<int64_t>(prompt.size()) + steps);
  return r;
}

inline void expect_matches_oracle(const std::string& dir, const std::string& expected, double tol) {
  Loaded l = load(dir, DType::f32);
  const int64_t V = l.model->config().vocab_size;
  double worst = 0;
  for (const Prompt& p : load_expected(expected)) {
    const int steps = static_cast<int>(p.greedy.size());
    ASSERT_GE(steps, 8);
    const ModelRun r = run_alone(*l.model, p.ids, steps);
    ASSERT_EQ(r.prefill.size(), p.prefill.size());
    for (size_t t = 0; t < p.ids.size(); ++t) {
      const double e = row_error(r.prefill.data() + t * V, p.prefill.data() + t * V, V);
      EXPECT_LT(e, tol) << dir << " prompt of " << p.ids.size() << " tokens, position " << t;
      worst = std::max(worst, e);
    }
    EXPECT_EQ(r.greedy, p.greedy) << dir;
    for (int s = 0; s < steps; ++s) {
      const double e = row_error(r.decode.data() + s * V, p.decode.data() + s * V, V);
      EXPECT_LT(e, tol) << dir << " prompt of " << p.ids.size() << " tokens, decode step " << s;
      worst = std::max(worst, e);
    }
  }
  std::printf("%s: largest max |diff| / max |ref| over prefill and decode rows: %.3g\n", dir.c_str(), worst);
}

}  // namespace xmoe::llm::test
