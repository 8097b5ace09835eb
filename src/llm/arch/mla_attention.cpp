#include "llm/arch/mla_attention.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "kernels/linear.hpp"
#include "llm/layers/rmsnorm.hpp"
#include "moe/parallel.hpp"
#include "util/buffer.hpp"
#include "xmoe/error.hpp"

namespace xmoe::llm {

namespace {

// The RoPE part of `heads` rows (`stride` apart, `dim` values each) into out [heads, dim] in the
// rotate_half layout: interleaved pairs (x0, x1), (x2, x3), ... become [x0, x2, ...; x1, x3, ...], which
// is what apply_rotary_pos_emb_interleave computes (the output order is the same for q and k, so dot
// products do not see it).
void gather_rope(const float* x, int64_t stride, int heads, int dim, bool interleaved, float* out) {
  const int half = dim / 2;
  for (int h = 0; h < heads; ++h) {
    const float* src = x + h * stride;
    float* dst = out + h * dim;
    if (interleaved) {
      for (int i = 0; i < half; ++i) dst[i] = src[2 * i], dst[half + i] = src[2 * i + 1];
    } else {
      std::copy(src, src + dim, dst);
    }
  }
}

void scatter_rope(const float* in, int heads, int dim, float* x, int64_t stride) {
  for (int h = 0; h < heads; ++h) std::copy(in + h * dim, in + (h + 1) * dim, x + h * stride);
}

// s[0, n) replaced by its softmax (max-subtracted, f32).
void softmax(float* s, int64_t n) {
  float m = -INFINITY;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, s[i]);
  float sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += (s[i] = std::exp(s[i] - m));
  const float inv = 1.0f / sum;
  for (int64_t i = 0; i < n; ++i) s[i] *= inv;
}

}  // namespace

MlaAttention::MlaAttention(const MlaDims& dims, MlaWeights weights, MlaForm form)
    : d_(dims), w_(std::move(weights)), form_(form) {
  XMOE_CHECK(d_.heads > 0 && d_.kv_lora_rank > 0 && d_.qk_nope > 0 && d_.qk_rope > 0 && d_.qk_rope % 2 == 0 &&
                 d_.v_head > 0 && d_.q_lora_rank >= 0 && d_.scale > 0,
             "MLA attention: heads, kv_lora_rank, qk_nope_head_dim, v_head_dim must be > 0, qk_rope_head_dim "
             "even and > 0, got ",
             d_.heads, ", ", d_.kv_lora_rank, ", ", d_.qk_nope, ", ", d_.v_head, ", ", d_.qk_rope);
  const int64_t per_head = d_.qk_nope + d_.v_head, R = d_.kv_lora_rank;
  XMOE_CHECK(w_.kv_b.rows == d_.heads * per_head && w_.kv_b.cols == R, "MLA attention: kv_b_proj is [",
             w_.kv_b.rows, ", ", w_.kv_b.cols, "], expected [", d_.heads * per_head, ", ", R, "]");
  XMOE_CHECK(static_cast<int64_t>(w_.kv_a_norm.size()) == R &&
                 static_cast<int64_t>(w_.q_a_norm.size()) == d_.q_lora_rank,
             "MLA attention: latent norm sizes do not match kv_lora_rank / q_lora_rank");
  kv_b_.resize(static_cast<size_t>(w_.kv_b.rows * R));
  for (int64_t r = 0; r < w_.kv_b.rows; ++r) w_.kv_b.row_to_f32(r, kv_b_.data() + r * R);
  kv_b_f32_.format = kernels::WeightFormat::f32;
  kv_b_f32_.rows = w_.kv_b.rows;
  kv_b_f32_.cols = R;
  kv_b_f32_.data = reinterpret_cast<const std::byte*>(kv_b_.data());
  kv_b_f32_.row_bytes = R * static_cast<int64_t>(sizeof(float));
}

size_t MlaAttention::bytes() const {
  size_t n = w_.kv_a.bytes() + w_.o.bytes() + kv_b_.size() * sizeof(float) +
             (w_.q_a_norm.size() + w_.kv_a_norm.size()) * sizeof(float);
  n += d_.q_lora_rank > 0 ? w_.q_a.bytes() + w_.q_b.bytes() : w_.q.bytes();
  return n;
}

void MlaAttention::forward(const kernels::KernelTable& table, const Rope& rope, const StepRows& step,
                           KvCache& cache, int layer, const float* x, float* out, AttentionScratch& scratch) {
  const int L = d_.latent_width(), R = d_.kv_lora_rank, nh = d_.heads, qh = d_.qk_head();
  XMOE_CHECK(cache.window(layer) == 0 && cache.latent_width(layer) == L, "MLA attention: layer ", layer,
             " needs a full-attention latent cache layer of ", L, " values per token, the cache keeps ",
             cache.latent_width(layer), (cache.window(layer) > 0 ? " in a sliding window" : ""));
  if (d_.max_context > 0)
    for (size_t c = 0; c < step.seq.size(); ++c) {
      const int64_t context = step.start[c] + (step.first[c + 1] - step.first[c]);
      XMOE_CHECK(
          context <= d_.max_context, "sequence ", step.seq[c], ": a context of ", context,
          " tokens exceeds index_topk = ", d_.max_context,
          " (DeepSeek-V3.2's sparse attention indexer is not implemented; dense MLA equals it only up to "
          "index_topk tokens)");
    }
  const int64_t T = step.rows(), q_width = int64_t{nh} * qh, QL = d_.q_lora_rank;
  float* q = scratch.qkv.ensure(static_cast<size_t>(T * (q_width + L + QL)));
  float* kv = q + T * q_width;
  if (QL > 0) {
    float* qa = kv + T * L;
    kernels::linear_forward(table, w_.q_a, x, T, qa);
    rms_norm_rows(qa, qa, T, QL, QL, w_.q_a_norm.data(), d_.latent_eps);
    kernels::linear_forward(table, w_.q_b, qa, T, q);
  } else {
    kernels::linear_forward(table, w_.q, x, T, q);
  }
  kernels::linear_forward(table, w_.kv_a, x, T, kv);
  rms_norm_rows(kv, kv, T, R, L, w_.kv_a_norm.data(), d_.latent_eps);

  const int dr = d_.qk_rope;
  moe::parallel_rows(T, 4, [&](int64_t a, int64_t b) {
    std::vector<float> pe(static_cast<size_t>(nh * dr));
    for (int64_t t = a; t < b; ++t) {
      const auto c = static_cast<size_t>(step.chunk_of[static_cast<size_t>(t)]);
      const int64_t pos = step.start[c] + (t - step.first[c]);
      const int64_t seq_len = step.start[c] + (step.first[c + 1] - step.first[c]);
      float* qpe = q + t * q_width + d_.qk_nope;
      gather_rope(qpe, qh, nh, dr, d_.rope_interleave, pe.data());
      rope.apply(pe.data(), nh, pos, seq_len);
      scatter_rope(pe.data(), nh, dr, qpe, qh);
      float* kpe = kv + t * L + R;
      gather_rope(kpe, L, 1, dr, d_.rope_interleave, pe.data());
      rope.apply(pe.data(), 1, pos, seq_len);
      scatter_rope(pe.data(), 1, dr, kpe, L);
    }
  });

  // The new positions' latent rows into the cache.
  const int bs = cache.block_size();
  const bool f32 = cache.dtype() == DType::f32;
  for (size_t c = 0; c < step.seq.size(); ++c) {
    for (int64_t t = step.first[c]; t < step.first[c + 1]; ++t) {
      const int64_t p = step.start[c] + (t - step.first[c]);
      void* block = cache.latent_block(layer, cache.block_of(step.seq[c], layer, p));
      const float* src = kv + t * L;
      if (f32)
        std::copy(src, src + L, static_cast<float*>(block) + (p % bs) * L);
      else
        table.f32_to_bf16(src, static_cast<bf16*>(block) + (p % bs) * L, L);
    }
  }

  const int64_t o_width = int64_t{nh} * d_.v_head;
  float* attn = scratch.attn.ensure(static_cast<size_t>(T * o_width));
  std::vector<int64_t> absorbed;  // rows run in the absorbed form
  for (size_t c = 0; c < step.seq.size(); ++c) {
    const int64_t n = step.first[c + 1] - step.first[c];
    const bool absorb = form_ == MlaForm::absorbed || (form_ == MlaForm::automatic && n == 1);
    if (absorb) {
      for (int64_t t = step.first[c]; t < step.first[c + 1]; ++t) absorbed.push_back(t);
    } else {
      attend_expanded(table, cache, layer, step.seq[c], step.start[c], n, q + step.first[c] * q_width,
                      q_width, attn + step.first[c] * o_width, o_width);
    }
  }
  const int64_t items = static_cast<int64_t>(absorbed.size()) * nh;
#pragma omp parallel for schedule(dynamic, 4) if (items > 1)
  for (int64_t it = 0; it < items; ++it) {
    const int64_t t = absorbed[static_cast<size_t>(it / nh)];
    const int h = static_cast<int>(it % nh);
    const auto c = static_cast<size_t>(step.chunk_of[static_cast<size_t>(t)]);
    attend_absorbed(table, cache, layer, step.seq[c], step.start[c] + (t - step.first[c]),
                    q + t * q_width + int64_t{h} * qh, attn + t * o_width + int64_t{h} * d_.v_head, h);
  }
  kernels::linear_forward(table, w_.o, attn, T, out);
}

void MlaAttention::attend_absorbed(const kernels::KernelTable& table, KvCache& cache, int layer,
                                   SequenceId seq, int64_t pos, const float* q, float* out, int h) const {
  const int R = d_.kv_lora_rank, L = d_.latent_width(), nope = d_.qk_nope, dr = d_.qk_rope;
  const int64_t per_head = nope + d_.v_head, n = pos + 1;
  const int bs = cache.block_size();
  const bool f32 = cache.dtype() == DType::f32;
  std::vector<float> q_lat(static_cast<size_t>(R), 0.0f), o_lat(static_cast<size_t>(R), 0.0f),
      s(static_cast<size_t>(n));
  // q_lat = W_UKᵀ q_nope: the query in latent space.
  const float* w_uk = kv_b_.data() + h * per_head * R;
  for (int i = 0; i < nope; ++i) table.axpy_f32(q[i], w_uk + int64_t{i} * R, q_lat.data(), R);
  const float* q_pe = q + nope;
  for (int64_t p0 = 0; p0 < n; p0 += bs) {
    const void* block = cache.latent_block(layer, cache.block_of(seq, layer, p0));
    for (int64_t p = p0; p < std::min(n, p0 + bs); ++p) {
      const int64_t at = (p - p0) * L;
      const float dot = f32 ? table.dot_f32(static_cast<const float*>(block) + at, q_lat.data(), R) +
                                  table.dot_f32(static_cast<const float*>(block) + at + R, q_pe, dr)
                            : table.dot_bf16_f32(static_cast<const bf16*>(block) + at, q_lat.data(), R) +
                                  table.dot_bf16_f32(static_cast<const bf16*>(block) + at + R, q_pe, dr);
      s[static_cast<size_t>(p)] = dot * d_.scale;
    }
  }
  softmax(s.data(), n);
  for (int64_t p0 = 0; p0 < n; p0 += bs) {
    const void* block = cache.latent_block(layer, cache.block_of(seq, layer, p0));
    for (int64_t p = p0; p < std::min(n, p0 + bs); ++p) {
      const int64_t at = (p - p0) * L;
      const float w = s[static_cast<size_t>(p)];
      if (f32)
        table.axpy_f32(w, static_cast<const float*>(block) + at, o_lat.data(), R);
      else
        table.axpy_bf16_f32(w, static_cast<const bf16*>(block) + at, o_lat.data(), R);
    }
  }
  // out = W_UV o_lat.
  const float* w_uv = w_uk + int64_t{nope} * R;
  for (int j = 0; j < d_.v_head; ++j) out[j] = table.dot_f32(w_uv + int64_t{j} * R, o_lat.data(), R);
}

void MlaAttention::attend_expanded(const kernels::KernelTable& table, KvCache& cache, int layer,
                                   SequenceId seq, int64_t first_pos, int64_t n, const float* q, int64_t ldq,
                                   float* out, int64_t ldo) {
  const int R = d_.kv_lora_rank, L = d_.latent_width(), nope = d_.qk_nope, dr = d_.qk_rope, nh = d_.heads;
  const int qh = d_.qk_head(), dv = d_.v_head;
  const int64_t P = first_pos + n, per_head = nope + dv, width = nh * per_head;
  const int bs = cache.block_size();
  // Every cached position's latent in f32, then k_nope and v of every head from kv_b_proj.
  Buffer<float> latents, expanded;
  float* lat = latents.ensure(static_cast<size_t>(P * L));
  for (int64_t p0 = 0; p0 < P; p0 += bs) {
    const void* block = cache.latent_block(layer, cache.block_of(seq, layer, p0));
    const int64_t rows = std::min<int64_t>(bs, P - p0);
    if (cache.dtype() == DType::f32)
      std::copy_n(static_cast<const float*>(block), rows * L, lat + p0 * L);
    else
      table.bf16_to_f32(static_cast<const bf16*>(block), lat + p0 * L, rows * L);
  }
  float* kvx = expanded.ensure(static_cast<size_t>(P * width));
  kernels::linear_forward(table, kv_b_f32_, lat, P, L, kvx, width);

  const int64_t items = n * nh;
#pragma omp parallel if (items > 1)
  {
    std::vector<float> s;
#pragma omp for schedule(dynamic, 4)
    for (int64_t it = 0; it < items; ++it) {
      const int64_t i = it / nh, pos = first_pos + i;
      const int h = static_cast<int>(it % nh);
      const float* qi = q + i * ldq + int64_t{h} * qh;
      s.resize(static_cast<size_t>(pos + 1));
      for (int64_t p = 0; p <= pos; ++p) {
        const float dot = table.dot_f32(kvx + p * width + h * per_head, qi, nope) +
                          table.dot_f32(lat + p * L + R, qi + nope, dr);
        s[static_cast<size_t>(p)] = dot * d_.scale;
      }
      softmax(s.data(), pos + 1);
      float* o = out + i * ldo + int64_t{h} * dv;
      std::fill(o, o + dv, 0.0f);
      for (int64_t p = 0; p <= pos; ++p)
        table.axpy_f32(s[static_cast<size_t>(p)], kvx + p * width + h * per_head + nope, o, dv);
    }
  }
}

MlaNames mla_names(const std::string& prefix) {
  return {prefix + "q_proj.weight",
          prefix + "q_a_proj.weight",
          prefix + "q_a_layernorm.weight",
          prefix + "q_b_proj.weight",
          prefix + "kv_a_proj_with_mqa.weight",
          prefix + "kv_a_layernorm.weight",
          prefix + "kv_b_proj.weight",
          prefix + "o_proj.weight"};
}

int parse_q_lora_rank(const FieldReader& r, int class_default) {
  if (r.has("q_lora_rank")) return static_cast<int>(r.get_int("q_lora_rank", 0, 1, kMaxConfigInt));
  try {
    (void)r.at("q_lora_rank");  // present, and null
    return 0;
  } catch (const nlohmann::json::out_of_range&) {
    return class_default;
  }
}

float mla_softmax_scale(const FieldReader& r, const ModelConfig& c, int qk_head) {
  double scale = 1.0 / std::sqrt(static_cast<double>(qk_head));
  if (c.rope_scaling && c.rope_scaling->type != "default") {
    const FieldReader rs(r.at(c.rope_scaling->source.c_str()), r.where(), c.rope_scaling->source + ".");
    const double all_dim = rs.opt_number("mscale_all_dim").value_or(0.0);
    const double factor = c.rope_scaling->factor;
    if (all_dim != 0 && factor > 1) {
      const double mscale = 0.1 * all_dim * std::log(factor) + 1.0;
      scale *= mscale * mscale;
    }
  }
  return static_cast<float>(scale);
}

void add_mla_tensors(std::vector<PlannedTensor>& t, const MlaNames& n, const MlaDims& d, int64_t hidden) {
  constexpr TensorRole kQuant = TensorRole::quantized_linear;
  const int64_t H = hidden, nh = d.heads;
  if (d.q_lora_rank > 0) {
    t.push_back(random_tensor(n.q_a, {d.q_lora_rank, H}, kQuant));
    t.push_back(constant_tensor(n.q_a_norm, {d.q_lora_rank}, TensorInit::ones));
    t.push_back(random_tensor(n.q_b, {nh * d.qk_head(), d.q_lora_rank}, kQuant));
  } else {
    t.push_back(random_tensor(n.q, {nh * d.qk_head(), H}, kQuant));
  }
  t.push_back(random_tensor(n.kv_a, {d.latent_width(), H}, kQuant));
  t.push_back(constant_tensor(n.kv_a_norm, {d.kv_lora_rank}, TensorInit::ones));
  t.push_back(random_tensor(n.kv_b, {nh * (d.qk_nope + d.v_head), d.kv_lora_rank}, kQuant));
  t.push_back(random_tensor(n.o, {H, nh * d.v_head}, kQuant));
}

MlaWeights load_mla_weights(DecoderLoader& ld, const MlaNames& n, const MlaDims& d, int64_t hidden) {
  const int64_t H = hidden, nh = d.heads;
  MlaWeights w;
  if (d.q_lora_rank > 0) {
    w.q_a = ld.matrix(n.q_a, d.q_lora_rank, H);
    w.q_a_norm = ld.vector(n.q_a_norm, d.q_lora_rank);
    w.q_b = ld.matrix(n.q_b, nh * d.qk_head(), d.q_lora_rank);
  } else {
    w.q = ld.matrix(n.q, nh * d.qk_head(), H);
  }
  w.kv_a = ld.matrix(n.kv_a, d.latent_width(), H);
  w.kv_a_norm = ld.vector(n.kv_a_norm, d.kv_lora_rank);
  w.kv_b = ld.matrix(n.kv_b, nh * (d.qk_nope + d.v_head), d.kv_lora_rank);
  w.o = ld.matrix(n.o, H, nh * d.v_head);
  return w;
}

}  // namespace xmoe::llm
