#include "llm/qwen3_moe.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>

#include "kernels/kernels.hpp"
#include "kernels/linear.hpp"
#include "llm/layers/attention.hpp"
#include "llm/layers/quantized_views.hpp"
#include "llm/layers/rmsnorm.hpp"
#include "llm/layers/rope.hpp"
#include "llm/layers/weights.hpp"
#include "moe/parallel.hpp"
#include "moe/routed_experts.hpp"
#include "util/buffer.hpp"
#include "xmoe/error.hpp"
#include "xmoe/llm_routing.hpp"

namespace xmoe::llm {

namespace {

using kernels::PackedWeight;
using moe::parallel_rows;

std::string layer_name(int i, const std::string& rest) {
  return std::string("model.layers.").append(std::to_string(i)) + "." + rest;
}

// Linears that read the same input, written side by side into one output row: one view when the checkpoint
// holds them back to back (one pass over the input rows), else one per part.
struct SideBySide {
  std::vector<PackedWeight> parts;
  int64_t width = 0;  // output columns of all parts together

  explicit SideBySide(std::vector<PackedWeight> ws = {}) {
    for (const PackedWeight& w : ws) width += w.rows;
    if (auto joined = kernels::join_rows(ws)) ws = {*joined};
    parts = std::move(ws);
  }
  size_t bytes() const {
    size_t n = 0;
    for (const PackedWeight& w : parts) n += w.bytes();
    return n;
  }
  // y [m, width] = x [m, cols] · [W_0; W_1; …]ᵀ
  void forward(const kernels::KernelTable& table, const float* x, int64_t m, float* y) const {
    int64_t col = 0;
    for (const PackedWeight& w : parts) {
      kernels::linear_forward(table, w, x, m, w.cols, y + col, width);
      col += w.rows;
    }
  }
};

struct Layer {
  std::vector<float> input_norm, post_norm, q_norm, k_norm;
  SideBySide qkv;  // q_proj, k_proj, v_proj
  PackedWeight o;
  bool sparse = false;
  PackedWeight router;  // [E, H]
  std::unique_ptr<moe::RoutedExperts> experts;
  SideBySide gate_up;  // dense MLP: gate_proj, up_proj [I, H] each
  PackedWeight down;   // [H, I]
};

class Qwen3Moe final : public CausalLM {
 public:
  Qwen3Moe(const Checkpoint& ckpt, const LoadOptions& options)
      : cfg_(ckpt.config()), dtype_(options.dtype), rope_(ckpt.config()), weights_(ckpt, options.dtype) {
    const std::string where = ckpt.dir() + "/config.json: ";
    XMOE_CHECK(dtype_ == DType::f32 || dtype_ == DType::bf16,
               "load options: dtype must be float32 or bfloat16, got ", dtype_name(dtype_));
    XMOE_CHECK(!cfg_.attention_bias, where, "attention_bias: true is not supported by Qwen3MoeForCausalLM");
    XMOE_CHECK(cfg_.hidden_size > 0 && cfg_.vocab_size > 0 && cfg_.num_hidden_layers > 0 && cfg_.head_dim > 0,
               where, "hidden_size, vocab_size, num_hidden_layers and head_dim must be > 0");
    XMOE_CHECK(cfg_.num_attention_heads > 0 && cfg_.num_key_value_heads > 0 &&
                   cfg_.num_attention_heads % cfg_.num_key_value_heads == 0,
               where, "num_attention_heads (", cfg_.num_attention_heads,
               ") must be a positive multiple of num_key_value_heads (", cfg_.num_key_value_heads, ")");
    const kernels::CpuFeatures features = kernels::detect_cpu_features();
    table_ = options.isa.empty() ? &kernels::best_kernel_table(features)
                                 : &kernels::kernel_table(kernels::parse_isa(options.isa), features);

    total_bytes_ = ckpt.total_bytes();
    progress_ = options.progress;
    const int64_t H = cfg_.hidden_size, D = cfg_.head_dim;
    const int64_t q_rows = cfg_.num_attention_heads * D, kv_rows = cfg_.num_key_value_heads * D;

    embed_ = load_matrix("model.embed_tokens.weight", cfg_.vocab_size, H);
    if (!cfg_.tie_word_embeddings) lm_head_ = load_matrix("lm_head.weight", cfg_.vocab_size, H);
    final_norm_ = load_norm(ckpt, "model.norm.weight", H);

    layers_.resize(static_cast<size_t>(cfg_.num_hidden_layers));
    for (int i = 0; i < cfg_.num_hidden_layers; ++i) {
      Layer& L = layers_[static_cast<size_t>(i)];
      L.input_norm = load_norm(ckpt, layer_name(i, "input_layernorm.weight"), H);
      L.post_norm = load_norm(ckpt, layer_name(i, "post_attention_layernorm.weight"), H);
      L.q_norm = load_norm(ckpt, layer_name(i, "self_attn.q_norm.weight"), D);
      L.k_norm = load_norm(ckpt, layer_name(i, "self_attn.k_norm.weight"), D);
      L.qkv = SideBySide({load_matrix(layer_name(i, "self_attn.q_proj.weight"), q_rows, H),
                          load_matrix(layer_name(i, "self_attn.k_proj.weight"), kv_rows, H),
                          load_matrix(layer_name(i, "self_attn.v_proj.weight"), kv_rows, H)});
      L.o = load_matrix(layer_name(i, "self_attn.o_proj.weight"), H, q_rows);
      L.sparse = cfg_.is_sparse_layer(i);
      if (L.sparse) {
        XMOE_CHECK(cfg_.moe_intermediate_size > 0 && cfg_.num_experts_per_tok >= 1 &&
                       cfg_.num_experts_per_tok <= cfg_.num_experts,
                   where,
                   "MoE layers need moe_intermediate_size > 0 and 1 <= num_experts_per_tok <= num_experts");
        L.router = load_matrix(layer_name(i, "mlp.gate.weight"), cfg_.num_experts, H);
        load_experts(ckpt, i, L);
      } else {
        const int64_t I = cfg_.intermediate_size;
        XMOE_CHECK(I > 0, where, "intermediate_size must be > 0 for the dense MLP of layer ", i);
        L.gate_up = SideBySide({load_matrix(layer_name(i, "mlp.gate_proj.weight"), I, H),
                                load_matrix(layer_name(i, "mlp.up_proj.weight"), I, H)});
        L.down = load_matrix(layer_name(i, "mlp.down_proj.weight"), H, I);
      }
    }
    router_.type = LlmRouterType::qwen3;
    router_.num_experts = cfg_.num_experts;
    router_.top_k = cfg_.num_experts_per_tok;
    router_.norm_topk_prob = cfg_.norm_topk_prob;
    if (cfg_.num_experts > 0) validate(router_);
  }

  const ModelConfig& config() const override { return cfg_; }
  DType dtype() const override { return dtype_; }

  size_t weight_bytes_per_token() const override {
    size_t experts = 0;
    for (const Layer& L : layers_)
      if (L.sparse) experts += static_cast<size_t>(cfg_.num_experts_per_tok) * expert_bytes(L);
    return step_bytes_without_experts() + embedding_row_bytes() + experts;
  }

  uint64_t weight_bytes_read() const override { return weight_bytes_read_; }

  void forward(std::span<const SequenceChunk> batch, KvCache& cache, std::vector<float>& logits) override {
    const int64_t H = cfg_.hidden_size, D = cfg_.head_dim, V = cfg_.vocab_size;
    const int Hq = cfg_.num_attention_heads, KV = cfg_.num_key_value_heads;
    check_batch(batch, cache);
    weight_bytes_read_ += step_bytes_without_experts();

    // Token rows of the step: chunk c's tokens are rows [first[c], first[c+1]).
    std::vector<int64_t> first(batch.size() + 1, 0), start(batch.size());
    for (size_t c = 0; c < batch.size(); ++c) {
      first[c + 1] = first[c] + static_cast<int64_t>(batch[c].tokens.size());
      start[c] = cache.length(batch[c].seq);
    }
    const int64_t T = first.back();
    weight_bytes_read_ += static_cast<uint64_t>(T) * embedding_row_bytes();
    std::vector<int64_t> chunk_of(static_cast<size_t>(T));
    for (size_t c = 0; c < batch.size(); ++c)
      std::fill(chunk_of.begin() + first[c], chunk_of.begin() + first[c + 1], static_cast<int64_t>(c));

    float* hidden = hidden_.ensure(static_cast<size_t>(T * H));
    float* normed = normed_.ensure(static_cast<size_t>(T * H));
    for (size_t c = 0; c < batch.size(); ++c)
      for (size_t i = 0; i < batch[c].tokens.size(); ++i)
        embed_.row_to_f32(batch[c].tokens[i], hidden + (first[c] + static_cast<int64_t>(i)) * H);

    const int64_t q_width = Hq * D, kv_width = KV * D, qkv_width = q_width + 2 * kv_width;
    const AttentionDims dims{Hq, KV, static_cast<int>(D), 1.0f / std::sqrt(static_cast<float>(D))};
    const float eps = static_cast<float>(cfg_.rms_norm_eps);
    for (int li = 0; li < cfg_.num_hidden_layers; ++li) {
      Layer& L = layers_[static_cast<size_t>(li)];
      rms_norm_rows(hidden, normed, T, H, H, L.input_norm.data(), eps);
      float* qkv = qkv_.ensure(static_cast<size_t>(T * qkv_width));
      L.qkv.forward(*table_, normed, T, qkv);
      parallel_rows(T, 4, [&](int64_t a, int64_t b) {
        for (int64_t t = a; t < b; ++t) {
          const auto c = static_cast<size_t>(chunk_of[static_cast<size_t>(t)]);
          const int64_t pos = start[c] + (t - first[c]), seq_len = start[c] + (first[c + 1] - first[c]);
          float* q = qkv + t * qkv_width;
          float* k = q + q_width;
          rms_norm_rows(q, q, Hq, D, D, L.q_norm.data(), eps);
          rms_norm_rows(k, k, KV, D, D, L.k_norm.data(), eps);
          rope_.apply(q, Hq, pos, seq_len);
          rope_.apply(k, KV, pos, seq_len);
        }
      });
      for (size_t c = 0; c < batch.size(); ++c) {
        const float* k = qkv + first[c] * qkv_width + q_width;
        write_kv(cache, li, batch[c].seq, start[c], first[c + 1] - first[c], k, k + kv_width, qkv_width);
      }
      float* attn = attn_.ensure(static_cast<size_t>(T * q_width));
      const int64_t items = T * Hq;
#pragma omp parallel if (items > 1)
      {
        std::vector<float> scratch;
#pragma omp for schedule(dynamic, 4)
        for (int64_t it = 0; it < items; ++it) {
          const int64_t t = it / Hq;
          const int h = static_cast<int>(it % Hq);
          const auto c = static_cast<size_t>(chunk_of[static_cast<size_t>(t)]);
          attend(*table_, cache, li, batch[c].seq, start[c] + (t - first[c]), h, dims,
                 qkv + t * qkv_width + h * D, attn + t * q_width + h * D, scratch);
        }
      }
      float* proj = proj_.ensure(static_cast<size_t>(T * H));
      kernels::linear_forward(*table_, L.o, attn, T, proj);
      add_rows(hidden, proj, T * H);

      rms_norm_rows(hidden, normed, T, H, H, L.post_norm.data(), eps);
      if (L.sparse)
        moe_block(L, normed, T, proj);
      else
        dense_mlp(L, normed, T, proj);
      add_rows(hidden, proj, T * H);
    }

    // Logits rows: every token of an all_logits chunk, else its last token.
    std::vector<int64_t> rows;
    for (size_t c = 0; c < batch.size(); ++c) {
      if (batch[c].all_logits)
        for (int64_t t = first[c]; t < first[c + 1]; ++t) rows.push_back(t);
      else
        rows.push_back(first[c + 1] - 1);
    }
    const auto R = static_cast<int64_t>(rows.size());
    for (int64_t r = 0; r < R; ++r)
      std::copy(hidden + rows[static_cast<size_t>(r)] * H, hidden + (rows[static_cast<size_t>(r)] + 1) * H,
                normed + r * H);
    rms_norm_rows(normed, normed, R, H, H, final_norm_.data(), eps);
    logits.resize(static_cast<size_t>(R * V));
    kernels::linear_forward(*table_, cfg_.tie_word_embeddings ? embed_ : lm_head_, normed, R, logits.data());

    for (size_t c = 0; c < batch.size(); ++c)
      cache.set_length(batch[c].seq, start[c] + (first[c + 1] - first[c]));
  }

 private:
  size_t embedding_row_bytes() const {
    return embed_.bytes() / static_cast<size_t>(embed_.rows);
  }
  static size_t expert_bytes(const Layer& L) {
    return L.experts->experts().expert(0).bytes();
  }
  // What every step reads whatever its tokens: attention, routers, dense MLPs, norms and the lm_head.
  size_t step_bytes_without_experts() const {
    size_t bytes =
        (cfg_.tie_word_embeddings ? embed_.bytes() : lm_head_.bytes()) + final_norm_.size() * sizeof(float);
    for (const Layer& L : layers_) {
      bytes += (L.input_norm.size() + L.post_norm.size() + L.q_norm.size() + L.k_norm.size()) * sizeof(float);
      bytes += L.qkv.bytes() + L.o.bytes();
      bytes += L.sparse ? L.router.bytes() : L.gate_up.bytes() + L.down.bytes();
    }
    return bytes;
  }

  // Progress in checkpoint bytes: what the weight loader has looked at plus the norm vectors.
  void report() {
    const size_t done = weights_.checkpoint_bytes() + norm_bytes_;
    if (progress_) progress_(std::min(done, total_bytes_), total_bytes_);
  }
  PackedWeight load_matrix(const std::string& name, int64_t rows, int64_t cols) {
    PackedWeight w = weights_.matrix(name, rows, cols);
    report();
    return w;
  }
  std::vector<float> load_norm(const Checkpoint& ckpt, const std::string& name, int64_t n) {
    std::vector<float> v = load_vector(ckpt, name, n);
    norm_bytes_ += ckpt.weight(name).bytes.size();
    report();
    return v;
  }
  // The experts as views: per-expert tensors, or slices of the fused gate_up_proj [E, 2I, H] (gate rows
  // first, then up rows) and down_proj [E, H, I].
  void load_experts(const Checkpoint& ckpt, int i, Layer& L) {
    const int E = cfg_.num_experts;
    const int64_t H = cfg_.hidden_size, I = cfg_.moe_intermediate_size;
    std::vector<moe::SwigluWeights> experts(static_cast<size_t>(E));
    const std::string fused = layer_name(i, "mlp.experts.gate_up_proj");
    if (holds_linear(ckpt, fused)) {
      const std::string down = layer_name(i, "mlp.experts.down_proj");
      const std::vector<PackedWeight> gate_up = weights_.stacked(fused, E, 2 * I, H);
      const std::vector<PackedWeight> downs = weights_.stacked(down, E, H, I);
      for (size_t e = 0; e < experts.size(); ++e) {
        experts[e].gate = kernels::slice_rows(gate_up[e], 0, I);
        experts[e].up = kernels::slice_rows(gate_up[e], I, I);
        experts[e].down = downs[e];
      }
      report();
    } else {
      for (int e = 0; e < E; ++e) {
        const std::string prefix = layer_name(i, std::string("mlp.experts.").append(std::to_string(e)) + ".");
        moe::SwigluWeights& w = experts[static_cast<size_t>(e)];
        w.gate = load_matrix(prefix + "gate_proj.weight", I, H);
        w.up = load_matrix(prefix + "up_proj.weight", I, H);
        w.down = load_matrix(prefix + "down_proj.weight", H, I);
      }
    }
    for (int e = 0; e < E; ++e) {
      const moe::SwigluWeights& w = experts[static_cast<size_t>(e)];
      XMOE_CHECK(w.gate.global_scale == w.up.global_scale, "checkpoint ", ckpt.dir(), ": layer ", i,
                 " expert ", e, ": gate_proj and up_proj have different global scales (", w.gate.global_scale,
                 " and ", w.up.global_scale,
                 "); NVFP4 requires one shared weight_scale_2 / weight_global_scale");
    }
    L.experts = std::make_unique<moe::RoutedExperts>(std::move(experts), *table_);
  }

  void check_batch(std::span<const SequenceChunk> batch, KvCache& cache) const {
    const KvCacheShape want = kv_cache_shape();
    XMOE_CHECK(cache.shape().num_layers == want.num_layers &&
                   cache.shape().num_kv_heads == want.num_kv_heads && cache.shape().head_dim == want.head_dim,
               "forward: the KV cache's shape does not match the model's (", want.num_layers, " layers, ",
               want.num_kv_heads, " kv heads of ", want.head_dim, ")");
    XMOE_CHECK(!batch.empty(), "forward: empty batch");
    std::set<SequenceId> seen;
    for (const SequenceChunk& ch : batch) {
      XMOE_CHECK(seen.insert(ch.seq).second, "forward: sequence ", ch.seq, " appears twice in one batch");
      XMOE_CHECK(!ch.tokens.empty(), "forward: sequence ", ch.seq, " has no new tokens");
      for (int32_t tok : ch.tokens)
        XMOE_CHECK(tok >= 0 && tok < cfg_.vocab_size, "forward: token id ", tok, " of sequence ", ch.seq,
                   " out of range [0, ", cfg_.vocab_size, ")");
      const int64_t room = static_cast<int64_t>(cache.block_table(ch.seq).size()) * cache.block_size();
      const int64_t need = cache.length(ch.seq) + static_cast<int64_t>(ch.tokens.size());
      XMOE_CHECK(need <= room, "forward: sequence ", ch.seq, " needs cache room for ", need, " tokens, has ",
                 room, " (reserve first)");
    }
  }

  static void add_rows(float* y, const float* x, int64_t n) {
    parallel_rows(n, 1 << 14, [&](int64_t a, int64_t b) {
      for (int64_t i = a; i < b; ++i) y[i] += x[i];
    });
  }

  void dense_mlp(const Layer& L, const float* x, int64_t T, float* y) {
    const int64_t I = L.down.cols;
    float* gu = mlp_.ensure(static_cast<size_t>(T * 2 * I));
    float* act = act_.ensure(static_cast<size_t>(T * I));
    L.gate_up.forward(*table_, x, T, gu);
    parallel_rows(T, 16, [&](int64_t a, int64_t b) {
      for (int64_t t = a; t < b; ++t)
        table_->silu_mul_f32(gu + t * 2 * I, gu + t * 2 * I + I, act + t * I, I);
    });
    kernels::linear_forward(*table_, L.down, act, T, y);
  }

  void moe_block(Layer& L, const float* x, int64_t T, float* y) {
    const int E = cfg_.num_experts, k = cfg_.num_experts_per_tok;
    float* router_logits = router_logits_.ensure(static_cast<size_t>(T * E));
    kernels::linear_forward(*table_, L.router, x, T, router_logits);
    ids_.resize(static_cast<size_t>(T * k));
    route_weights_.resize(static_cast<size_t>(T * k));
    llm_route(router_, router_logits, nullptr, T, ids_.data(), route_weights_.data());
    expert_chosen_.assign(static_cast<size_t>(E), 0);
    for (int32_t id : ids_) expert_chosen_[static_cast<size_t>(id)] = 1;
    weight_bytes_read_ +=
        static_cast<uint64_t>(std::count(expert_chosen_.begin(), expert_chosen_.end(), 1)) * expert_bytes(L);
    L.experts->forward(x, T, k, ids_.data(), route_weights_.data(), y);
  }

  ModelConfig cfg_;
  DType dtype_;
  Rope rope_;
  const kernels::KernelTable* table_ = nullptr;
  LlmRouterConfig router_;
  WeightLoader weights_;  // owns what is not mapped in place
  PackedWeight embed_, lm_head_;
  std::vector<float> final_norm_;
  std::vector<Layer> layers_;
  ProgressFn progress_;
  size_t norm_bytes_ = 0, total_bytes_ = 0;
  uint64_t weight_bytes_read_ = 0;
  std::vector<char> expert_chosen_;  // by expert, in the MoE layer being run

  Buffer<float> hidden_, normed_, qkv_, attn_, proj_, mlp_, act_, router_logits_;
  std::vector<int32_t> ids_;
  std::vector<float> route_weights_;
};

}  // namespace

std::unique_ptr<CausalLM> load_qwen3_moe(const Checkpoint& checkpoint, const LoadOptions& options) {
  return std::make_unique<Qwen3Moe>(checkpoint, options);
}

}  // namespace xmoe::llm
