#include "llm/qwen3_moe.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <variant>

#include "kernels/kernels.hpp"
#include "llm/layers/attention.hpp"
#include "llm/layers/expert_kernels.hpp"
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

using moe::parallel_rows;

std::string layer_name(int i, const std::string& rest) {
  return std::string("model.layers.").append(std::to_string(i)) + "." + rest;
}

// Norm weights stay f32 whatever the model dtype (exact for bf16 checkpoints).
std::vector<float> load_vector(const Checkpoint& ckpt, const std::string& name, int64_t n) {
  const int64_t shape[] = {n};
  const WeightView view = ckpt.weight(name, shape);
  std::vector<float> out(static_cast<size_t>(n));
  view.to_f32(0, n, out.data());
  return out;
}

// The MoE block's experts in the model's storage type.
using RoutedExpertsAny =
    std::variant<std::unique_ptr<moe::RoutedExperts<float>>, std::unique_ptr<moe::RoutedExperts<bf16>>>;

struct Layer {
  std::vector<float> input_norm, post_norm, q_norm, k_norm;
  WeightMatrix qkv;  // q_proj, k_proj, v_proj rows stacked: one pass over the normed rows
  WeightMatrix o;
  bool sparse = false;
  WeightMatrix router;  // [E, H]
  RoutedExpertsAny experts;
  WeightMatrix gate_up;  // dense MLP: gate_proj then up_proj rows [2I, H]
  WeightMatrix down;     // [H, I]
};

class Qwen3Moe final : public CausalLM {
 public:
  Qwen3Moe(const Checkpoint& ckpt, const LoadOptions& options)
      : cfg_(ckpt.config()), dtype_(options.dtype), rope_(ckpt.config()) {
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
    linear_ = &linear_kernels(table_->isa);

    total_bytes_ = ckpt.total_bytes();
    progress_ = options.progress;
    const int64_t H = cfg_.hidden_size, D = cfg_.head_dim;
    const int64_t q_rows = cfg_.num_attention_heads * D, kv_rows = cfg_.num_key_value_heads * D;

    embed_ = load_matrix(ckpt, "model.embed_tokens.weight", cfg_.vocab_size, H);
    if (!cfg_.tie_word_embeddings) lm_head_ = load_matrix(ckpt, "lm_head.weight", cfg_.vocab_size, H);
    final_norm_ = load_norm(ckpt, "model.norm.weight", H);

    layers_.resize(static_cast<size_t>(cfg_.num_hidden_layers));
    for (int i = 0; i < cfg_.num_hidden_layers; ++i) {
      Layer& L = layers_[static_cast<size_t>(i)];
      L.input_norm = load_norm(ckpt, layer_name(i, "input_layernorm.weight"), H);
      L.post_norm = load_norm(ckpt, layer_name(i, "post_attention_layernorm.weight"), H);
      L.q_norm = load_norm(ckpt, layer_name(i, "self_attn.q_norm.weight"), D);
      L.k_norm = load_norm(ckpt, layer_name(i, "self_attn.k_norm.weight"), D);
      L.qkv = WeightMatrix(dtype_, q_rows + 2 * kv_rows, H);
      fill(ckpt, L.qkv, layer_name(i, "self_attn.q_proj.weight"), {q_rows, H}, 0);
      fill(ckpt, L.qkv, layer_name(i, "self_attn.k_proj.weight"), {kv_rows, H}, q_rows);
      fill(ckpt, L.qkv, layer_name(i, "self_attn.v_proj.weight"), {kv_rows, H}, q_rows + kv_rows);
      L.o = load_matrix(ckpt, layer_name(i, "self_attn.o_proj.weight"), H, q_rows);
      L.sparse = cfg_.is_sparse_layer(i);
      if (L.sparse) {
        XMOE_CHECK(cfg_.moe_intermediate_size > 0 && cfg_.num_experts_per_tok >= 1 &&
                       cfg_.num_experts_per_tok <= cfg_.num_experts,
                   where,
                   "MoE layers need moe_intermediate_size > 0 and 1 <= num_experts_per_tok <= num_experts");
        L.router = load_matrix(ckpt, layer_name(i, "mlp.gate.weight"), cfg_.num_experts, H);
        load_experts(ckpt, i, L);
      } else {
        const int64_t I = cfg_.intermediate_size;
        XMOE_CHECK(I > 0, where, "intermediate_size must be > 0 for the dense MLP of layer ", i);
        L.gate_up = WeightMatrix(dtype_, 2 * I, H);
        fill(ckpt, L.gate_up, layer_name(i, "mlp.gate_proj.weight"), {I, H}, 0);
        fill(ckpt, L.gate_up, layer_name(i, "mlp.up_proj.weight"), {I, H}, I);
        L.down = load_matrix(ckpt, layer_name(i, "mlp.down_proj.weight"), H, I);
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
    size_t sparse_layers = 0;
    for (const Layer& L : layers_) sparse_layers += L.sparse ? 1 : 0;
    return step_bytes_without_experts() + embedding_row_bytes() +
           sparse_layers * static_cast<size_t>(cfg_.num_experts_per_tok) * expert_bytes();
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
      linear_forward(*linear_, L.qkv, normed, T, qkv);
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
      linear_forward(*linear_, L.o, attn, T, proj);
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
    linear_forward(*linear_, cfg_.tie_word_embeddings ? embed_ : lm_head_, normed, R, logits.data());

    for (size_t c = 0; c < batch.size(); ++c)
      cache.set_length(batch[c].seq, start[c] + (first[c + 1] - first[c]));
  }

 private:
  size_t embedding_row_bytes() const {
    return static_cast<size_t>(cfg_.hidden_size) * dtype_size(dtype_);
  }
  size_t expert_bytes() const {
    return 3 * static_cast<size_t>(cfg_.moe_intermediate_size * cfg_.hidden_size) * dtype_size(dtype_);
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

  void report(size_t bytes) {
    loaded_bytes_ += bytes;
    if (progress_) progress_(std::min(loaded_bytes_, total_bytes_), total_bytes_);
  }
  WeightMatrix load_matrix(const Checkpoint& ckpt, const std::string& name, int64_t rows, int64_t cols) {
    WeightMatrix w = WeightMatrix::load(ckpt, name, dtype_, rows, cols);
    report(ckpt.weight(name).bytes.size());
    return w;
  }
  std::vector<float> load_norm(const Checkpoint& ckpt, const std::string& name, int64_t n) {
    std::vector<float> v = load_vector(ckpt, name, n);
    report(ckpt.weight(name).bytes.size());
    return v;
  }
  void fill(const Checkpoint& ckpt, WeightMatrix& w, const std::string& name, std::vector<int64_t> shape,
            int64_t row0) {
    const WeightView view = ckpt.weight(name, shape);
    w.fill_rows(view, 0, row0, shape[0]);
    report(view.bytes.size());
  }

  // Copies the checkpoint's experts (per-expert tensors or fused gate_up_proj / down_proj) into the experts'
  // stacked parameters gate_proj, up_proj [E, I, H] and down_proj [E, H, I].
  void load_experts(const Checkpoint& ckpt, int i, Layer& L) {
    const int E = cfg_.num_experts;
    const int64_t H = cfg_.hidden_size, I = cfg_.moe_intermediate_size;
    MoeConfig mc;
    mc.experts.type = "swiglu";
    mc.experts.num_experts = E;
    mc.experts.hidden_size = I;
    mc.experts.has_fc1_bias = mc.experts.has_fc2_bias = false;
    mc.model_dim = H;
    mc.dtype = dtype_;
    mc.gate.k = cfg_.num_experts_per_tok;
    auto copy_into = [&](Parameter& p, int64_t dst_offset, const WeightView& view, int64_t src_offset,
                         int64_t count) {
      if (dtype_ == DType::f32)
        view.to_f32(src_offset, count, p.value.data<float>() + dst_offset);
      else
        view.to_bf16(src_offset, count, reinterpret_cast<uint16_t*>(p.value.data<bf16>() + dst_offset));
    };
    auto load_into = [&](auto& experts) {
      Parameter& gate = experts->parameter("experts.gate_proj");
      Parameter& up = experts->parameter("experts.up_proj");
      Parameter& down = experts->parameter("experts.down_proj");
      // Views are looked up first (that is where a missing or misshapen tensor throws); the copies then run
      // over experts in parallel (page faults of the mapping and of the new storage dominate loading).
      struct Source {
        WeightView view;
        int64_t offset;
      };
      std::vector<Source> gates, ups, downs;
      const std::string fused = layer_name(i, "mlp.experts.gate_up_proj");
      if (ckpt.contains(fused)) {
        const int64_t gu_shape[] = {E, 2 * I, H}, d_shape[] = {E, H, I};
        const WeightView gu = ckpt.weight(fused, gu_shape);
        const WeightView d = ckpt.weight(layer_name(i, "mlp.experts.down_proj"), d_shape);
        for (int64_t e = 0; e < E; ++e) {
          gates.push_back({gu, e * 2 * I * H});  // gate rows first, then up rows
          ups.push_back({gu, e * 2 * I * H + I * H});
          downs.push_back({d, e * H * I});
        }
      } else {
        for (int64_t e = 0; e < E; ++e) {
          const std::string prefix =
              layer_name(i, std::string("mlp.experts.").append(std::to_string(e)) + ".");
          const int64_t ih[] = {I, H}, hi[] = {H, I};
          gates.push_back({ckpt.weight(prefix + "gate_proj.weight", ih), 0});
          ups.push_back({ckpt.weight(prefix + "up_proj.weight", ih), 0});
          downs.push_back({ckpt.weight(prefix + "down_proj.weight", hi), 0});
        }
      }
      std::string failure;
#pragma omp parallel for schedule(dynamic)
      for (int64_t e = 0; e < E; ++e) {
        try {
          const auto u = static_cast<size_t>(e);
          copy_into(gate, e * I * H, gates[u].view, gates[u].offset, I * H);
          copy_into(up, e * I * H, ups[u].view, ups[u].offset, I * H);
          copy_into(down, e * H * I, downs[u].view, downs[u].offset, H * I);
        } catch (const std::exception& ex) {
#pragma omp critical
          failure = ex.what();
        }
      }
      XMOE_CHECK(failure.empty(), failure);
      const WeightView& any = gates[0].view;
      report(3 * static_cast<size_t>(E * I * H) * (any.bytes.size() / static_cast<size_t>(any.numel())));
    };
    if (dtype_ == DType::f32) {
      auto experts = std::make_unique<moe::RoutedExperts<float>>(mc, expert_kernel_table(table_->isa));
      load_into(experts);
      L.experts = std::move(experts);
    } else {
      auto experts = std::make_unique<moe::RoutedExperts<bf16>>(mc, expert_kernel_table(table_->isa));
      load_into(experts);
      L.experts = std::move(experts);
    }
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
    const int64_t I = L.down.cols();
    float* gu = mlp_.ensure(static_cast<size_t>(T * 2 * I));
    float* act = act_.ensure(static_cast<size_t>(T * I));
    linear_forward(*linear_, L.gate_up, x, T, gu);
    parallel_rows(T, 16, [&](int64_t a, int64_t b) {
      for (int64_t t = a; t < b; ++t)
        table_->silu_mul_f32(gu + t * 2 * I, gu + t * 2 * I + I, act + t * I, I);
    });
    linear_forward(*linear_, L.down, act, T, y);
  }

  void moe_block(Layer& L, const float* x, int64_t T, float* y) {
    const int E = cfg_.num_experts, k = cfg_.num_experts_per_tok;
    const int64_t H = cfg_.hidden_size;
    float* router_logits = router_logits_.ensure(static_cast<size_t>(T * E));
    linear_forward(*linear_, L.router, x, T, router_logits);
    ids_.resize(static_cast<size_t>(T * k));
    weights_.resize(static_cast<size_t>(T * k));
    llm_route(router_, router_logits, nullptr, T, ids_.data(), weights_.data());
    expert_chosen_.assign(static_cast<size_t>(E), 0);
    for (int32_t id : ids_) expert_chosen_[static_cast<size_t>(id)] = 1;
    weight_bytes_read_ +=
        static_cast<uint64_t>(std::count(expert_chosen_.begin(), expert_chosen_.end(), 1)) * expert_bytes();
    if (auto* f = std::get_if<std::unique_ptr<moe::RoutedExperts<float>>>(&L.experts)) {
      (*f)->forward(x, T, k, ids_.data(), weights_.data(), y);
    } else {
      auto& b = std::get<std::unique_ptr<moe::RoutedExperts<bf16>>>(L.experts);
      bf16* xb = x_bf16_.ensure(static_cast<size_t>(T * H));
      parallel_rows(T, 16,
                    [&](int64_t a, int64_t e) { table_->f32_to_bf16(x + a * H, xb + a * H, (e - a) * H); });
      b->forward(xb, T, k, ids_.data(), weights_.data(), y);
    }
  }

  ModelConfig cfg_;
  DType dtype_;
  Rope rope_;
  const kernels::KernelTable* table_ = nullptr;
  const LinearKernels* linear_ = nullptr;
  LlmRouterConfig router_;
  WeightMatrix embed_, lm_head_;
  std::vector<float> final_norm_;
  std::vector<Layer> layers_;
  ProgressFn progress_;
  size_t loaded_bytes_ = 0, total_bytes_ = 0;
  uint64_t weight_bytes_read_ = 0;
  std::vector<char> expert_chosen_;  // by expert, in the MoE layer being run

  Buffer<float> hidden_, normed_, qkv_, attn_, proj_, mlp_, act_, router_logits_;
  Buffer<bf16> x_bf16_;
  std::vector<int32_t> ids_;
  std::vector<float> weights_;
};

}  // namespace

std::unique_ptr<CausalLM> load_qwen3_moe(const Checkpoint& checkpoint, const LoadOptions& options) {
  return std::make_unique<Qwen3Moe>(checkpoint, options);
}

}  // namespace xmoe::llm
