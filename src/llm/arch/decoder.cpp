#include "llm/arch/decoder.hpp"

#include <algorithm>
#include <set>

#include "kernels/linear.hpp"
#include "llm/layers/rmsnorm.hpp"
#include "llm/layers/rope.hpp"
#include "moe/parallel.hpp"
#include "util/buffer.hpp"
#include "xmoe/error.hpp"

namespace xmoe::llm {

namespace {

using kernels::PackedWeight;
using moe::parallel_rows;

const kernels::KernelTable& kernel_table_for(const LoadOptions& options) {
  const kernels::CpuFeatures features = kernels::detect_cpu_features();
  const kernels::Isa isa =
      options.isa.empty() ? kernels::best_isa(features) : kernels::parse_isa(options.isa);
  return kernels::kernel_table(isa, features, options.matmul_precision);
}

}  // namespace

DecoderLoader::DecoderLoader(const Checkpoint& ckpt, const LoadOptions& options)
    : ckpt_(ckpt),
      dtype_(options.dtype),
      table_(&kernel_table_for(options)),
      weights_(ckpt, options.dtype),
      progress_(options.progress),
      total_bytes_(ckpt.total_bytes()) {}

void DecoderLoader::report() {
  // Progress in checkpoint bytes: what the weight loader has looked at plus the f32 vectors.
  const size_t done = weights_.checkpoint_bytes() + vector_bytes_;
  if (progress_) progress_(std::min(done, total_bytes_), total_bytes_);
}

PackedWeight DecoderLoader::matrix(const std::string& name, int64_t rows, int64_t cols) {
  PackedWeight w = weights_.matrix(name, rows, cols);
  report();
  return w;
}

std::vector<PackedWeight> DecoderLoader::stacked(const std::string& name, int64_t count, int64_t rows,
                                                 int64_t cols) {
  std::vector<PackedWeight> w = weights_.stacked(name, count, rows, cols);
  report();
  return w;
}

std::vector<float> DecoderLoader::vector(const std::string& name, int64_t n) {
  std::vector<float> v = load_vector(ckpt_, name, n);
  vector_bytes_ += ckpt_.weight(name).bytes.size();
  report();
  return v;
}

namespace {

// GQA attention: the kit's AttentionBlock as one kind of attention layer.
class GqaAttention final : public AttentionLayer {
 public:
  explicit GqaAttention(std::unique_ptr<AttentionBlock> block) : block_(std::move(block)) {}
  void forward(const kernels::KernelTable& table, const Rope& rope, const StepRows& step, KvCache& cache,
               int layer, const float* x, float* out, AttentionScratch& scratch) override {
    block_->forward(table, rope, step, cache, layer, x, out, scratch);
  }
  size_t bytes() const override { return block_->bytes(); }

 private:
  std::unique_ptr<AttentionBlock> block_;
};

struct Layer {
  std::vector<float> input_norm, post_norm;
  std::unique_ptr<AttentionLayer> attention;
  std::unique_ptr<FeedForward> ffn;
};

// A decode step's residual add (16 rows of 2048 at most) takes a few microseconds, less than a team's
// wake-up: split only from 2^17 values (64 prefill rows).
void add_rows(float* y, const float* x, int64_t n) {
  parallel_rows(n, 1 << 17, [&](int64_t a, int64_t b) {
    for (int64_t i = a; i < b; ++i) y[i] += x[i];
  });
}

class Decoder final : public CausalLM {
 public:
  Decoder(const Checkpoint& ckpt, const LoadOptions& options, DecoderSpec spec)
      : cfg_(ckpt.config()),
        dtype_(options.dtype),
        opts_(spec.attention),
        kv_latent_width_(spec.kv_latent_width),
        rope_(ckpt.config()) {
    const std::string where = ckpt.dir() + "/config.json: ";
    XMOE_CHECK(dtype_ == DType::f32 || dtype_ == DType::bf16,
               "load options: dtype must be float32 or bfloat16, got ", dtype_name(dtype_));
    XMOE_CHECK(cfg_.hidden_size > 0 && cfg_.vocab_size > 0 && cfg_.num_hidden_layers > 0 && cfg_.head_dim > 0,
               where, "hidden_size, vocab_size, num_hidden_layers and head_dim must be > 0");
    XMOE_CHECK(cfg_.num_attention_heads > 0 && cfg_.num_key_value_heads > 0 &&
                   cfg_.num_attention_heads % cfg_.num_key_value_heads == 0,
               where, "num_attention_heads (", cfg_.num_attention_heads,
               ") must be a positive multiple of num_key_value_heads (", cfg_.num_key_value_heads, ")");
    loader_ = std::make_unique<DecoderLoader>(ckpt, options);
    DecoderLoader& ld = *loader_;
    table_ = &ld.table();
    const int64_t H = cfg_.hidden_size;

    embed_ = ld.matrix(spec.embed, cfg_.vocab_size, H);
    if (!cfg_.tie_word_embeddings) lm_head_ = ld.matrix(spec.lm_head, cfg_.vocab_size, H);
    final_norm_ = ld.vector(spec.final_norm, H);

    layers_.resize(static_cast<size_t>(cfg_.num_hidden_layers));
    for (int i = 0; i < cfg_.num_hidden_layers; ++i) {
      Layer& L = layers_[static_cast<size_t>(i)];
      const DecoderLayerNames n = spec.layer_names(i);
      L.input_norm = ld.vector(n.input_norm, H);
      L.post_norm = ld.vector(n.post_norm, H);
      if (spec.attention_layer) {
        L.attention = spec.attention_layer(i, ld);
        XMOE_CHECK(L.attention != nullptr, where, "layer ", i, " has no attention");
      } else {
        L.attention = load_gqa(ld, n.attention, i);
      }
      L.ffn = spec.feed_forward(i, ld);
      XMOE_CHECK(L.ffn != nullptr, where, "layer ", i, " has no feed-forward block");
    }
  }

  const ModelConfig& config() const override { return cfg_; }
  DType dtype() const override { return dtype_; }

  KvCacheShape kv_cache_shape() const override {
    KvCacheShape shape = CausalLM::kv_cache_shape();
    if (kv_latent_width_ > 0)
      shape.layer_latent.assign(static_cast<size_t>(cfg_.num_hidden_layers), kv_latent_width_);
    return shape;
  }

  size_t weight_bytes_per_token() const override {
    size_t experts = 0;
    for (const Layer& L : layers_) experts += L.ffn->per_token_bytes();
    return step_bytes_without_experts() + embedding_row_bytes() + experts;
  }

  uint64_t weight_bytes_read() const override { return weight_bytes_read_; }

  void set_profile(StepProfile* profile) override {
    profile_ = profile;
    attention_scratch_.profile = profile;
    for (Layer& L : layers_) L.ffn->set_profile(profile);
  }

  void forward(std::span<const SequenceChunk> batch, KvCache& cache, std::vector<float>& logits) override {
    const int64_t H = cfg_.hidden_size, V = cfg_.vocab_size;
    check_batch(batch, cache);
    weight_bytes_read_ += step_bytes_without_experts();

    // Token rows of the step: chunk c's tokens are rows [first[c], first[c+1]).
    StepRows step;
    step.first.assign(batch.size() + 1, 0);
    for (size_t c = 0; c < batch.size(); ++c) {
      step.seq.push_back(batch[c].seq);
      step.first[c + 1] = step.first[c] + static_cast<int64_t>(batch[c].tokens.size());
      step.start.push_back(cache.length(batch[c].seq));
    }
    const std::vector<int64_t>& first = step.first;
    const int64_t T = step.rows();
    weight_bytes_read_ += static_cast<uint64_t>(T) * embedding_row_bytes();
    step.chunk_of.resize(static_cast<size_t>(T));
    for (size_t c = 0; c < batch.size(); ++c)
      std::fill(step.chunk_of.begin() + first[c], step.chunk_of.begin() + first[c + 1],
                static_cast<int64_t>(c));

    float* hidden = hidden_.ensure(static_cast<size_t>(T * H));
    float* normed = normed_.ensure(static_cast<size_t>(T * H));
    {
      ProfileScope scope(profile_, ProfileOp::embedding,
                         static_cast<double>(T) * static_cast<double>(embedding_row_bytes()));
      for (size_t c = 0; c < batch.size(); ++c)
        for (size_t i = 0; i < batch[c].tokens.size(); ++i)
          embed_.row_to_f32(batch[c].tokens[i], hidden + (first[c] + static_cast<int64_t>(i)) * H);
    }

    const float eps = static_cast<float>(cfg_.rms_norm_eps);
    // The norms' and residual adds' traffic: each reads and writes the hidden rows.
    const double norm_bytes = 2.0 * static_cast<double>(T * H) * sizeof(float);
    const std::pair<double, double> attention_work = profile_ ? attention_work_of(step) : std::pair{0.0, 0.0};
    for (int li = 0; li < cfg_.num_hidden_layers; ++li) {
      Layer& L = layers_[static_cast<size_t>(li)];
      float* proj = proj_.ensure(static_cast<size_t>(T * H));
      {
        ProfileScope scope(profile_, ProfileOp::norms, norm_bytes);
        rms_norm_rows(hidden, normed, T, H, H, L.input_norm.data(), eps);
      }
      {
        ProfileScope scope(profile_, ProfileOp::attention, attention_work.first, attention_work.second);
        L.attention->forward(*table_, rope_, step, cache, li, normed, proj, attention_scratch_);
      }
      {
        ProfileScope scope(profile_, ProfileOp::norms, 2 * norm_bytes);
        add_rows(hidden, proj, T * H);
        rms_norm_rows(hidden, normed, T, H, H, L.post_norm.data(), eps);
      }
      {
        ProfileScope scope(profile_, ProfileOp::experts);
        weight_bytes_read_ += L.ffn->forward(normed, T, proj, ffn_scratch_);
      }
      ProfileScope scope(profile_, ProfileOp::norms, norm_bytes);
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
    {
      ProfileScope scope(profile_, ProfileOp::norms, 2.0 * static_cast<double>(R * H) * sizeof(float));
      for (int64_t r = 0; r < R; ++r)
        std::copy(hidden + rows[static_cast<size_t>(r)] * H, hidden + (rows[static_cast<size_t>(r)] + 1) * H,
                  normed + r * H);
      rms_norm_rows(normed, normed, R, H, H, final_norm_.data(), eps);
    }
    logits.resize(static_cast<size_t>(R * V));
    const PackedWeight& head = cfg_.tie_word_embeddings ? embed_ : lm_head_;
    ProfileScope scope(profile_, ProfileOp::lm_head, static_cast<double>(head.bytes()),
                       2.0 * static_cast<double>(R) * static_cast<double>(V) * static_cast<double>(H));
    kernels::linear_forward(*table_, head, normed, R, logits.data());

    for (size_t c = 0; c < batch.size(); ++c)
      cache.set_length(batch[c].seq, step.start[c] + (first[c + 1] - first[c]));
  }

 private:
  std::unique_ptr<AttentionLayer> load_gqa(DecoderLoader& ld, const AttentionNames& a, int i) const {
    const int64_t H = cfg_.hidden_size, D = cfg_.head_dim;
    const int64_t q_rows = cfg_.num_attention_heads * D, kv_rows = cfg_.num_key_value_heads * D;
    AttentionWeights w;
    if (opts_.qk_norm) {
      w.q_norm = ld.vector(a.q_norm, D);
      w.k_norm = ld.vector(a.k_norm, D);
    }
    w.q = ld.matrix(a.q + ".weight", q_rows, H);
    w.k = ld.matrix(a.k + ".weight", kv_rows, H);
    w.v = ld.matrix(a.v + ".weight", kv_rows, H);
    if (opts_.qkv_bias) {
      w.q_bias = ld.vector(a.q + ".bias", q_rows);
      w.k_bias = ld.vector(a.k + ".bias", kv_rows);
      w.v_bias = ld.vector(a.v + ".bias", kv_rows);
    }
    w.o = ld.matrix(a.o + ".weight", H, q_rows);
    if (opts_.o_bias) w.o_bias = ld.vector(a.o + ".bias", H);
    if (opts_.sinks) w.sinks = ld.vector(a.sinks, cfg_.num_attention_heads);
    return std::make_unique<GqaAttention>(std::make_unique<AttentionBlock>(
        opts_, cfg_.num_attention_heads, cfg_.num_key_value_heads, cfg_.head_dim, cfg_.attention_window(i),
        static_cast<float>(cfg_.rms_norm_eps), std::move(w)));
  }

  // K/V bytes one layer's attention reads in a step (each sequence's context once) and its flops (q·k and
  // p·v per query head and visible position), for the profile; GQA's cache layout (MLA reads less).
  std::pair<double, double> attention_work_of(const StepRows& step) const {
    const double kv_row = 2.0 * static_cast<double>(cfg_.num_key_value_heads * cfg_.head_dim) *
                          static_cast<double>(dtype_size(dtype_));
    double bytes = 0, flops = 0;
    for (size_t c = 0; c < step.seq.size(); ++c) {
      const int64_t n = step.first[c + 1] - step.first[c], end = step.start[c] + n;
      bytes += kv_row * static_cast<double>(end);
      // Σ over the chunk's rows of their visible positions (start + 1 … end).
      const double visible = static_cast<double>(n) * static_cast<double>(step.start[c] + 1 + end) / 2.0;
      flops += 4.0 * visible * static_cast<double>(cfg_.num_attention_heads * cfg_.head_dim);
    }
    return {bytes, flops};
  }

  size_t embedding_row_bytes() const { return embed_.bytes() / static_cast<size_t>(embed_.rows); }
  // What every step reads whatever its tokens: attention, routers, dense MLPs, norms and the lm_head.
  size_t step_bytes_without_experts() const {
    size_t bytes =
        (cfg_.tie_word_embeddings ? embed_.bytes() : lm_head_.bytes()) + final_norm_.size() * sizeof(float);
    for (const Layer& L : layers_)
      bytes += (L.input_norm.size() + L.post_norm.size()) * sizeof(float) + L.attention->bytes() +
               L.ffn->fixed_bytes();
    return bytes;
  }

  void check_batch(std::span<const SequenceChunk> batch, KvCache& cache) const {
    const KvCacheShape want = kv_cache_shape();
    const KvCacheShape& have = cache.shape();
    XMOE_CHECK(have.num_layers == want.num_layers && have.num_kv_heads == want.num_kv_heads &&
                   have.head_dim == want.head_dim && have.layer_window == want.layer_window &&
                   have.layer_latent == want.layer_latent,
               "forward: the KV cache's shape does not match the model's (", want.num_layers, " layers, ",
               want.num_kv_heads, " kv heads of ", want.head_dim,
               want.layer_window.empty() ? "" : ", sliding windows per layer",
               want.layer_latent.empty() ? "" : ", a latent vector per layer", ")");
    XMOE_CHECK(!batch.empty(), "forward: empty batch");
    std::set<SequenceId> seen;
    for (const SequenceChunk& ch : batch) {
      XMOE_CHECK(seen.insert(ch.seq).second, "forward: sequence ", ch.seq, " appears twice in one batch");
      XMOE_CHECK(!ch.tokens.empty(), "forward: sequence ", ch.seq, " has no new tokens");
      for (int32_t tok : ch.tokens)
        XMOE_CHECK(tok >= 0 && tok < cfg_.vocab_size, "forward: token id ", tok, " of sequence ", ch.seq,
                   " out of range [0, ", cfg_.vocab_size, ")");
      const int64_t room = cache.capacity(ch.seq);
      const int64_t need = cache.length(ch.seq) + static_cast<int64_t>(ch.tokens.size());
      XMOE_CHECK(need <= room, "forward: sequence ", ch.seq, " needs cache room for ", need, " tokens, has ",
                 room, " (reserve first)");
    }
  }

  ModelConfig cfg_;
  DType dtype_;
  AttentionOptions opts_;
  int kv_latent_width_ = 0;
  Rope rope_;
  std::unique_ptr<DecoderLoader> loader_;  // owns the weights not mapped in place
  const kernels::KernelTable* table_ = nullptr;
  PackedWeight embed_, lm_head_;
  std::vector<float> final_norm_;
  std::vector<Layer> layers_;
  uint64_t weight_bytes_read_ = 0;
  StepProfile* profile_ = nullptr;
  Buffer<float> hidden_, normed_, proj_;
  AttentionScratch attention_scratch_;
  moe::ExpertScratch ffn_scratch_;  // lent to each layer's feed-forward block in turn
};

}  // namespace

std::unique_ptr<CausalLM> load_decoder(const Checkpoint& checkpoint, const LoadOptions& options,
                                       DecoderSpec spec) {
  return std::make_unique<Decoder>(checkpoint, options, std::move(spec));
}

}  // namespace xmoe::llm
