#include "llm/arch/mla_attention.hpp"

#include <algorithm>
#include <cmath>

#include "kernels/attention.hpp"
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
  // Per head W_UKᵀ, [R, nope], and W_UV, [dv, R], each contiguous: the absorbed form's linear weights (one
  // stream per head) and the expanded form's GEMM operands.
  const int nope = d_.qk_nope, dv = d_.v_head, nh = d_.heads;
  uk_t_.resize(static_cast<size_t>(int64_t{nh} * R * nope));
  uv_.resize(static_cast<size_t>(int64_t{nh} * dv * R));
  std::vector<float> row(static_cast<size_t>(R));
  for (int h = 0; h < nh; ++h) {
    for (int i = 0; i < nope; ++i) {
      w_.kv_b.row_to_f32(h * per_head + i, row.data());
      for (int64_t r = 0; r < R; ++r) uk_t_[static_cast<size_t>((h * R + r) * nope + i)] = row[r];
    }
    for (int j = 0; j < dv; ++j)
      w_.kv_b.row_to_f32(h * per_head + nope + j, uv_.data() + (int64_t{h} * dv + j) * R);
  }
}

size_t MlaAttention::bytes() const {
  size_t n = w_.kv_a.bytes() + w_.o.bytes() + (uk_t_.size() + uv_.size()) * sizeof(float) +
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

  float* attn = scratch.attn.ensure(static_cast<size_t>(T * int64_t{nh} * d_.v_head));
  attend(table, cache, layer, step, q, attn, scratch.mla);
  kernels::linear_forward(table, w_.o, attn, T, out);
}

bool MlaAttention::absorbs(int64_t rows) const {
  return form_ == MlaForm::absorbed || (form_ == MlaForm::automatic && rows == 1);
}

void MlaAttention::attend(const kernels::KernelTable& table, KvCache& cache, int layer, const StepRows& step,
                          const float* q, float* attn, MlaScratch& scratch) const {
  std::vector<size_t> absorbed, expanded;
  for (size_t c = 0; c < step.seq.size(); ++c)
    (absorbs(step.first[c + 1] - step.first[c]) ? absorbed : expanded).push_back(c);
  if (!absorbed.empty()) attend_absorbed(table, cache, layer, step, absorbed, q, attn, scratch);
  if (!expanded.empty()) attend_expanded(table, cache, layer, step, expanded, q, attn, scratch);
}

namespace {
// An f32 row-major [rows, cols] matrix as a kernel weight view.
kernels::PackedWeight f32_matrix(const float* data, int64_t rows, int64_t cols) {
  kernels::PackedWeight w;
  w.rows = rows, w.cols = cols;
  w.data = reinterpret_cast<const std::byte*>(data);
  w.row_bytes = cols * static_cast<int64_t>(sizeof(float));
  return w;
}
}  // namespace

kernels::PackedWeight MlaAttention::uk_view(int h) const {
  const int64_t R = d_.kv_lora_rank, nope = d_.qk_nope;
  return f32_matrix(uk_t_.data() + h * R * nope, R, nope);
}

kernels::PackedWeight MlaAttention::uv_view(int h) const {
  const int64_t R = d_.kv_lora_rank, dv = d_.v_head;
  return f32_matrix(uv_.data() + h * dv * R, dv, R);
}

void MlaAttention::attend_absorbed(const kernels::KernelTable& table, KvCache& cache, int layer,
                                   const StepRows& step, const std::vector<size_t>& chunks, const float* q,
                                   float* attn, MlaScratch& scratch) const {
  const int R = d_.kv_lora_rank, L = d_.latent_width(), nope = d_.qk_nope, nh = d_.heads, qh = d_.qk_head();
  const int dv = d_.v_head;
  const int64_t q_width = int64_t{nh} * qh, o_width = int64_t{nh} * dv, bs = cache.block_size();
  // The chunks' rows gathered (unless they are the whole step) so each head's products see one matrix.
  int64_t rows = 0;
  for (size_t c : chunks) rows += step.first[c + 1] - step.first[c];
  const bool whole = rows == step.rows();
  Buffer<float>& gathered = scratch.gathered;
  Buffer<float>& latent_q = scratch.latent_q;
  Buffer<float>& latent_out = scratch.latent_out;
  Buffer<float>& out_rows = scratch.out_rows;
  const float* qc = q;
  float* oc = attn;
  if (!whole) {
    float* g = gathered.ensure(static_cast<size_t>(rows * q_width));
    int64_t at = 0;
    for (size_t c : chunks)
      for (int64_t t = step.first[c]; t < step.first[c + 1]; ++t, ++at)
        std::copy_n(q + t * q_width, q_width, g + at * q_width);
    qc = g;
    oc = out_rows.ensure(static_cast<size_t>(rows * o_width));
  }
  // Per row and head [q_nope·W_UK (R) | q_pe (rope)]: the query against the cached [c_kv | k_pe] rows.
  float* ql = latent_q.ensure(static_cast<size_t>(rows * nh * L));
  float* ol = latent_out.ensure(static_cast<size_t>(rows * nh * R));
#pragma omp parallel for schedule(static) if (rows * nh > 1)
  for (int h = 0; h < nh; ++h) {
    kernels::linear_forward_columns(table, uk_view(h), qc + int64_t{h} * qh, rows, q_width, 0, R,
                                    ql + int64_t{h} * L, int64_t{nh} * L);
    for (int64_t t = 0; t < rows; ++t)
      std::copy_n(qc + t * q_width + int64_t{h} * qh + nope, d_.qk_rope, ql + (t * nh + h) * L + R);
  }

  // Every head reads the one latent K/V head; V is the first R values of each cached row.
  std::vector<kernels::AttentionSequence> seqs;
  std::vector<const void*> blocks;
  std::vector<size_t> block_start;
  int64_t at = 0;
  for (size_t c : chunks) {
    const int64_t n = step.first[c + 1] - step.first[c], last = step.start[c] + n - 1;
    block_start.push_back(blocks.size());
    for (int64_t j = 0; j <= last / bs; ++j)
      blocks.push_back(cache.latent_block(layer, cache.block_of(step.seq[c], layer, j * bs)));
    seqs.push_back({ql + at * nh * L, ol + at * nh * R, n, step.start[c], nullptr, nullptr, 0});
    at += n;
  }
  for (size_t i = 0; i < seqs.size(); ++i)
    seqs[i].k_blocks = seqs[i].v_blocks = blocks.data() + block_start[i];
  kernels::AttentionArgs args;
  args.heads = nh, args.kv_heads = 1, args.k_dim = L, args.v_dim = R;
  args.scale = d_.scale;
  args.q_ld = int64_t{nh} * L, args.q_head_stride = L, args.out_ld = int64_t{nh} * R,
  args.out_head_stride = R;
  args.kv_dtype = cache.dtype(), args.block_size = static_cast<int>(bs);
  args.k_pos_stride = args.v_pos_stride = L;
  args.seqs = seqs.data(), args.num_seqs = static_cast<int64_t>(seqs.size());
  kernels::attention(table, args);

  // out = W_UV·o_lat per head.
#pragma omp parallel for schedule(static) if (rows * nh > 1)
  for (int h = 0; h < nh; ++h)
    kernels::linear_forward_columns(table, uv_view(h), ol + int64_t{h} * R, rows, int64_t{nh} * R, 0, dv,
                                    oc + int64_t{h} * dv, o_width);
  if (!whole) {
    int64_t back = 0;
    for (size_t c : chunks)
      for (int64_t t = step.first[c]; t < step.first[c + 1]; ++t, ++back)
        std::copy_n(oc + back * o_width, o_width, attn + t * o_width);
  }
}

void MlaAttention::attend_expanded(const kernels::KernelTable& table, KvCache& cache, int layer,
                                   const StepRows& step, const std::vector<size_t>& chunks, const float* q,
                                   float* attn, MlaScratch& scratch) const {
  const int R = d_.kv_lora_rank, L = d_.latent_width(), nope = d_.qk_nope, dr = d_.qk_rope, nh = d_.heads;
  const int qh = d_.qk_head(), dv = d_.v_head;
  const int64_t q_width = int64_t{nh} * qh, o_width = int64_t{nh} * dv, bs = cache.block_size();
  const int64_t k_width = int64_t{nh} * qh;
  // Per chunk: its sequence's latents in f32, then K = [k_nope | k_pe] and V of every head and position,
  // laid out as one block per bs positions for the attention kernel.
  std::vector<Buffer<float>>& keys = scratch.keys;
  std::vector<Buffer<float>>& values = scratch.values;
  if (keys.size() < chunks.size()) {
    keys.resize(chunks.size());
    values.resize(chunks.size());
  }
  Buffer<float>& latents = scratch.latents;
  std::vector<kernels::AttentionSequence> seqs;
  std::vector<const void*> blocks;
  std::vector<size_t> block_start;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const size_t c = chunks[i];
    const int64_t n = step.first[c + 1] - step.first[c], P = step.start[c] + n;
    float* lat = latents.ensure(static_cast<size_t>(P * L));
    for (int64_t p0 = 0; p0 < P; p0 += bs) {
      const void* block = cache.latent_block(layer, cache.block_of(step.seq[c], layer, p0));
      const int64_t count = std::min(bs, P - p0);
      if (cache.dtype() == DType::f32)
        std::copy_n(static_cast<const float*>(block), count * L, lat + p0 * L);
      else
        table.bf16_to_f32(static_cast<const bf16*>(block), lat + p0 * L, count * L);
    }
    // Whole blocks: the kernel loads a block's chunks whole (positions past P masked, kept finite here).
    const int64_t padded = (P + bs - 1) / bs * bs;
    float* k = keys[i].ensure(static_cast<size_t>(padded * k_width));
    std::fill(k + P * k_width, k + padded * k_width, 0.0f);
    for (int h = 0; h < nh; ++h)
      table.gemm_f32({.m = P,
                      .n = nope,
                      .k = R,
                      .a = lat,
                      .lda = L,
                      .b = uk_t_.data() + int64_t{h} * R * nope,
                      .ldb = nope,
                      .c = k + int64_t{h} * qh,
                      .ldc = k_width});
    moe::parallel_rows(P, 16, [&](int64_t a, int64_t b) {
      for (int64_t p = a; p < b; ++p)
        for (int h = 0; h < nh; ++h)
          std::copy_n(lat + p * L + R, dr, k + p * k_width + int64_t{h} * qh + nope);
    });
    float* v = values[i].ensure(static_cast<size_t>(padded * o_width));
    std::fill(v + P * o_width, v + padded * o_width, 0.0f);
    table.gemm_f32({.m = P,
                    .n = o_width,
                    .k = R,
                    .a = lat,
                    .lda = L,
                    .b = uv_.data(),
                    .ldb = R,
                    .trans_b = true,
                    .c = v,
                    .ldc = o_width});
    block_start.push_back(blocks.size());
    for (int64_t p0 = 0; p0 < P; p0 += bs) blocks.push_back(k + p0 * k_width);
    for (int64_t p0 = 0; p0 < P; p0 += bs) blocks.push_back(v + p0 * o_width);
    seqs.push_back(
        {q + step.first[c] * q_width, attn + step.first[c] * o_width, n, step.start[c], nullptr, nullptr, 0});
  }
  for (size_t i = 0; i < seqs.size(); ++i) {
    const int64_t P = seqs[i].pos0 + seqs[i].n_q, nblocks = (P + bs - 1) / bs;
    seqs[i].k_blocks = blocks.data() + block_start[i];
    seqs[i].v_blocks = seqs[i].k_blocks + nblocks;
  }
  kernels::AttentionArgs args;
  args.heads = args.kv_heads = nh, args.k_dim = qh, args.v_dim = dv;
  args.scale = d_.scale;
  args.q_ld = q_width, args.q_head_stride = qh, args.out_ld = o_width, args.out_head_stride = dv;
  args.kv_dtype = DType::f32, args.block_size = static_cast<int>(bs);
  args.k_pos_stride = k_width, args.k_head_stride = qh, args.v_pos_stride = o_width, args.v_head_stride = dv;
  args.seqs = seqs.data(), args.num_seqs = static_cast<int64_t>(seqs.size());
  kernels::attention(table, args);
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
