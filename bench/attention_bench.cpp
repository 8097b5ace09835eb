// Attention benchmark at Qwen3-30B-A3B's shape (32 query heads, 4 KV heads, head_dim 128, bf16 paged cache
// of 16-position blocks), in one run:
//  * prefill of one L-token sequence (causal): GFLOP/s of each kernel level this CPU runs, as a share of the
//    register-only FMA peak of that level measured right before it, next to the loop it replaced (one query
//    head of one token at a time: dot products, a softmax, axpys through the kernel table);
//  * batched decode of S sequences at context L: GB/s of K/V read as a share of the DRAM read bandwidth
//    measured in the same run.
// --mode mla: DeepSeek-V3's multi-head latent attention (128 heads, kv_lora_rank 512, rope 64, nope 128,
// v 128), MlaAttention::attend between the projections, next to the loops it replaced (main at 255e35f):
//  * prefill of one L-token sequence in the expanded form: GFLOP/s (kv_b_proj expansion + attention) as a
//    share of the register FMA peak measured in the same run;
//  * batched decode of S sequences at context C in the absorbed form: bytes (latents + W_UK/W_UV) per
//    second as a share of the read-bandwidth probe, and GFLOP/s as a share of the FMA peak (absorbed decode
//    does ~240 FLOPs per latent byte, so at these contexts arithmetic bounds it, not the cache's bytes).
// Prints medians over --reps runs.
//
//   bench_attention [--threads 2] [--reps 5] [--lengths 512,2048] [--contexts 512,2048] [--decode-seqs 16]
//   bench_attention --mode mla [--isa avx512] [--threads 2] [--reps 3] [--lengths 512,2048]
//                   [--contexts 512,4096] [--decode-seqs 1,8,16]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/attention.hpp"
#include "kernels/cpu_features.hpp"
#include "kernels/kernels.hpp"
#include "kernels/linear.hpp"
#include "kernels/read_bandwidth.hpp"
#include "kernels/register_fma_peak.hpp"
#include "llm/arch/mla_attention.hpp"
#include "llm/kv_cache.hpp"
#include "util/huge_buffer.hpp"

namespace {

using namespace xmoe;
using namespace xmoe::kernels;

constexpr int kHeads = 32, kKvHeads = 4, kDim = 128, kBlock = 16;

double median_seconds(int reps, const std::function<void()>& fn) {
  fn();  // warm-up
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto a = std::chrono::steady_clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// `seqs` sequences of `len` cached positions in shuffled bf16 blocks, with `rows` query rows each at the end;
// the blocks in 2 MiB pages, as llm::KvCache holds them.
struct Setup {
  ZeroedHugeBuffer pool_memory;
  bf16* pool = nullptr;
  std::vector<std::vector<const void*>> k_blocks, v_blocks;
  std::vector<float> q, out;
  std::vector<AttentionSequence> seqs;
  AttentionArgs args;
  int64_t len, rows;

  Setup(int64_t num_seqs, int64_t len_, int64_t rows_) : len(len_), rows(rows_) {
    const int64_t row = int64_t{kKvHeads} * kDim, per_block = kBlock * row;
    const int64_t blocks = (len + kBlock - 1) / kBlock;
    const auto pool_size = static_cast<size_t>(2 * num_seqs * blocks * per_block);
    pool_memory = allocate_zeroed_huge_buffer(pool_size * sizeof(bf16));
    pool = reinterpret_cast<bf16*>(pool_memory.get());
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    for (size_t i = 0; i < pool_size; ++i) pool[i] = bf16(uni(rng));
    std::vector<int64_t> order(static_cast<size_t>(2 * num_seqs * blocks));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    const int64_t q_ld = int64_t{kHeads} * kDim;
    q.resize(static_cast<size_t>(num_seqs * rows * q_ld));
    for (float& x : q) x = uni(rng);
    out.resize(q.size());
    size_t next = 0;
    for (int64_t s = 0; s < num_seqs; ++s) {
      std::vector<const void*> kb, vb;
      for (int64_t j = 0; j < blocks; ++j) kb.push_back(pool + order[next++] * per_block);
      for (int64_t j = 0; j < blocks; ++j) vb.push_back(pool + order[next++] * per_block);
      k_blocks.push_back(std::move(kb)), v_blocks.push_back(std::move(vb));
    }
    for (int64_t s = 0; s < num_seqs; ++s)
      seqs.push_back({q.data() + s * rows * q_ld, out.data() + s * rows * q_ld, rows, len - rows,
                      k_blocks[static_cast<size_t>(s)].data(), v_blocks[static_cast<size_t>(s)].data(), 0});
    args.heads = kHeads, args.kv_heads = kKvHeads, args.k_dim = args.v_dim = kDim;
    args.scale = 1.0f / std::sqrt(static_cast<float>(kDim));
    args.q_ld = args.out_ld = q_ld, args.q_head_stride = args.out_head_stride = kDim;
    args.kv_dtype = DType::bf16, args.block_size = kBlock;
    args.k_pos_stride = args.v_pos_stride = row, args.k_head_stride = args.v_head_stride = kDim;
    args.seqs = seqs.data(), args.num_seqs = num_seqs;
  }

  // FLOPs of q·k and p·v over every (query, visible position) pair.
  double flops() const {
    double pairs = 0;
    for (int64_t r = 0; r < rows; ++r) pairs += static_cast<double>(len - rows + r + 1);
    return pairs * static_cast<double>(args.num_seqs) * kHeads * 4.0 * kDim;
  }
};

// The loop kernels::attention replaced: one query head of one token at a time, scores by dot products over
// the cache rows, a softmax, then axpys of the V rows (llm/layers/attention.cpp before this benchmark).
void row_at_a_time(const KernelTable& table, const Setup& st) {
  const AttentionSequence& sq = st.seqs[0];
  const int64_t row = int64_t{kKvHeads} * kDim, items = sq.n_q * kHeads;
#pragma omp parallel
  {
    std::vector<float> s;
#pragma omp for schedule(dynamic, 4)
    for (int64_t it = 0; it < items; ++it) {
      const int64_t r = it / kHeads, pos = sq.pos0 + r;
      const int h = static_cast<int>(it % kHeads), g = h / (kHeads / kKvHeads);
      const float* q = sq.q + r * st.args.q_ld + h * kDim;
      float* out = sq.out + r * st.args.out_ld + h * kDim;
      s.resize(static_cast<size_t>(pos + 1));
      for (int64_t p = 0; p <= pos; ++p) {
        const bf16* k = static_cast<const bf16*>(sq.k_blocks[p / kBlock]) + (p % kBlock) * row + g * kDim;
        s[static_cast<size_t>(p)] = table.dot_bf16_f32(k, q, kDim) * st.args.scale;
      }
      const float m = *std::max_element(s.begin(), s.end());
      float sum = 0;
      for (float& x : s) sum += (x = std::exp(x - m));
      std::fill(out, out + kDim, 0.0f);
      for (int64_t p = 0; p <= pos; ++p) {
        const bf16* v = static_cast<const bf16*>(sq.v_blocks[p / kBlock]) + (p % kBlock) * row + g * kDim;
        table.axpy_bf16_f32(s[static_cast<size_t>(p)] / sum, v, out, kDim);
      }
    }
  }
}

std::vector<int64_t> parse_list(const std::string& s) {
  std::vector<int64_t> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) out.push_back(std::stoll(item));
  return out;
}

double load_average() {
  double l = 0;
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &l) != 1) l = 0;
    std::fclose(f);
  }
  return l;
}

// ---- MLA (--mode mla): DeepSeek-V3's attention between its projections, MlaAttention::attend ----

constexpr int kMlaHeads = 128, kMlaRank = 512, kMlaRope = 64, kMlaNope = 128, kMlaV = 128;
constexpr int kMlaLatent = kMlaRank + kMlaRope, kMlaQk = kMlaNope + kMlaRope;

// A DeepSeek-V3-shaped MLA layer (f32 kv_b_proj, the form the layer holds at load) with a bf16 latent cache
// of `num_seqs` sequences of `len` positions; `rows` query rows per sequence at its end.
struct MlaSetup {
  std::vector<float> kv_b;
  std::unique_ptr<llm::MlaAttention> mla;
  std::unique_ptr<llm::KvCache> cache;
  llm::StepRows step;
  std::vector<float> q, attn;
  int64_t len, rows;

  MlaSetup(int64_t num_seqs, int64_t len_, int64_t rows_) : len(len_), rows(rows_) {
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    kv_b.resize(static_cast<size_t>(kMlaHeads) * (kMlaNope + kMlaV) * kMlaRank);
    for (float& x : kv_b) x = uni(rng) * 0.05f;
    llm::MlaDims d;
    d.heads = kMlaHeads, d.kv_lora_rank = kMlaRank, d.qk_nope = kMlaNope, d.qk_rope = kMlaRope;
    d.v_head = kMlaV, d.scale = 1.0f / std::sqrt(static_cast<float>(kMlaQk));
    llm::MlaWeights w;
    w.kv_b.rows = int64_t{kMlaHeads} * (kMlaNope + kMlaV), w.kv_b.cols = kMlaRank;
    w.kv_b.data = reinterpret_cast<const std::byte*>(kv_b.data());
    w.kv_b.row_bytes = kMlaRank * static_cast<int64_t>(sizeof(float));
    w.kv_a_norm.assign(kMlaRank, 1.0f);
    // The automatic form: expanded for prefill chunks, absorbed for one-row decode chunks.
    mla = std::make_unique<llm::MlaAttention>(d, std::move(w));
    const llm::KvCacheShape shape{1, 1, 1, {}, {kMlaLatent}};
    const size_t blocks = static_cast<size_t>(num_seqs * ((len + kBlock - 1) / kBlock));
    cache = std::make_unique<llm::KvCache>(shape, DType::bf16, blocks * kBlock * kMlaLatent * sizeof(bf16),
                                           kBlock);
    for (int64_t s = 0; s < num_seqs; ++s) {
      const llm::SequenceId id = cache->create_sequence();
      if (!cache->reserve(id, len)) throw std::runtime_error("bench: cache too small");
      for (int64_t p = 0; p < len; ++p) {
        auto* row =
            static_cast<bf16*>(cache->latent_block(0, cache->block_of(id, 0, p))) + (p % kBlock) * kMlaLatent;
        for (int i = 0; i < kMlaLatent; ++i) row[i] = bf16(uni(rng));
      }
      step.seq.push_back(id);
      step.first.push_back(s * rows);
      step.start.push_back(len - rows);
      for (int64_t r = 0; r < rows; ++r) step.chunk_of.push_back(s);
    }
    step.first.push_back(num_seqs * rows);
    q.resize(static_cast<size_t>(num_seqs * rows * kMlaHeads * kMlaQk));
    for (float& x : q) x = uni(rng);
    attn.resize(static_cast<size_t>(num_seqs * rows * kMlaHeads * kMlaV));
  }

  // The scratch lives across runs, as the model's does across layers and steps.
  void run(const KernelTable& table) { mla->attend(table, *cache, 0, step, q.data(), attn.data(), scratch); }
  llm::MlaScratch scratch;

  // (query, visible position) pairs over every sequence.
  double pairs() const {
    double n = 0;
    for (int64_t r = 0; r < rows; ++r) n += static_cast<double>(len - rows + r + 1);
    return n * static_cast<double>(step.seq.size());
  }
};

// The latents of positions [0, n) of `seq` as f32 rows (main's expanded form read them so).
std::vector<float> latents_f32(const KernelTable& table, MlaSetup& st, llm::SequenceId seq, int64_t n) {
  std::vector<float> lat(static_cast<size_t>(n * kMlaLatent));
  for (int64_t p0 = 0; p0 < n; p0 += kBlock)
    table.bf16_to_f32(static_cast<const bf16*>(st.cache->latent_block(0, st.cache->block_of(seq, 0, p0))),
                      lat.data() + p0 * kMlaLatent, std::min<int64_t>(kBlock, n - p0) * kMlaLatent);
  return lat;
}

// The loops MlaAttention ran before it used kernels::attention (main at 255e35f), kept here as the baseline:
// expanded prefill one (query row, head) at a time by dot products and axpys over every position.
void mla_expanded_rows(const KernelTable& table, MlaSetup& st) {
  const int64_t P = st.len, per_head = kMlaNope + kMlaV, width = int64_t{kMlaHeads} * per_head;
  const int64_t q_width = int64_t{kMlaHeads} * kMlaQk, o_width = int64_t{kMlaHeads} * kMlaV;
  const float scale = 1.0f / std::sqrt(static_cast<float>(kMlaQk));
  const std::vector<float> lat = latents_f32(table, st, st.step.seq[0], P);
  PackedWeight kv_b;
  kv_b.rows = width, kv_b.cols = kMlaRank, kv_b.data = reinterpret_cast<const std::byte*>(st.kv_b.data());
  kv_b.row_bytes = kMlaRank * static_cast<int64_t>(sizeof(float));
  std::vector<float> kvx(static_cast<size_t>(P * width));
  linear_forward(table, kv_b, lat.data(), P, kMlaLatent, kvx.data(), width);
  const int64_t first_pos = st.len - st.rows, items = st.rows * kMlaHeads;
#pragma omp parallel
  {
    std::vector<float> s;
#pragma omp for schedule(dynamic, 4)
    for (int64_t it = 0; it < items; ++it) {
      const int64_t i = it / kMlaHeads, pos = first_pos + i;
      const int h = static_cast<int>(it % kMlaHeads);
      const float* qi = st.q.data() + i * q_width + h * kMlaQk;
      s.resize(static_cast<size_t>(pos + 1));
      for (int64_t p = 0; p <= pos; ++p)
        s[static_cast<size_t>(p)] =
            (table.dot_f32(kvx.data() + p * width + h * per_head, qi, kMlaNope) +
             table.dot_f32(lat.data() + p * kMlaLatent + kMlaRank, qi + kMlaNope, kMlaRope)) *
            scale;
      const float m = *std::max_element(s.begin(), s.end());
      float sum = 0;
      for (float& x : s) sum += (x = std::exp(x - m));
      float* o = st.attn.data() + i * o_width + h * kMlaV;
      std::fill(o, o + kMlaV, 0.0f);
      for (int64_t p = 0; p <= pos; ++p)
        table.axpy_f32(s[static_cast<size_t>(p)] / sum, kvx.data() + p * width + h * per_head + kMlaNope, o,
                       kMlaV);
    }
  }
}

// Main's absorbed decode: per (sequence, head), q_lat by axpys of W_UK rows, scores and o_lat by dots and
// axpys over the cached latents, W_UV·o_lat by dots.
void mla_absorbed_rows(const KernelTable& table, MlaSetup& st) {
  const int64_t per_head = kMlaNope + kMlaV, q_width = int64_t{kMlaHeads} * kMlaQk;
  const float scale = 1.0f / std::sqrt(static_cast<float>(kMlaQk));
  const int64_t seqs = static_cast<int64_t>(st.step.seq.size()), items = seqs * kMlaHeads, n = st.len;
#pragma omp parallel for schedule(dynamic, 4)
  for (int64_t it = 0; it < items; ++it) {
    const int64_t c = it / kMlaHeads;
    const int h = static_cast<int>(it % kMlaHeads);
    const float* q = st.q.data() + c * q_width + h * kMlaQk;
    std::vector<float> q_lat(kMlaRank, 0.0f), o_lat(kMlaRank, 0.0f), s(static_cast<size_t>(n));
    const float* w_uk = st.kv_b.data() + h * per_head * kMlaRank;
    for (int i = 0; i < kMlaNope; ++i)
      table.axpy_f32(q[i], w_uk + int64_t{i} * kMlaRank, q_lat.data(), kMlaRank);
    for (int64_t p = 0; p < n; ++p) {
      const bf16* row =
          static_cast<const bf16*>(st.cache->latent_block(0, st.cache->block_of(st.step.seq[c], 0, p))) +
          (p % kBlock) * kMlaLatent;
      s[static_cast<size_t>(p)] = (table.dot_bf16_f32(row, q_lat.data(), kMlaRank) +
                                   table.dot_bf16_f32(row + kMlaRank, q + kMlaNope, kMlaRope)) *
                                  scale;
    }
    const float m = *std::max_element(s.begin(), s.end());
    float sum = 0;
    for (float& x : s) sum += (x = std::exp(x - m));
    for (int64_t p = 0; p < n; ++p) {
      const bf16* row =
          static_cast<const bf16*>(st.cache->latent_block(0, st.cache->block_of(st.step.seq[c], 0, p))) +
          (p % kBlock) * kMlaLatent;
      table.axpy_bf16_f32(s[static_cast<size_t>(p)] / sum, row, o_lat.data(), kMlaRank);
    }
    float* out = st.attn.data() + c * kMlaHeads * kMlaV + h * kMlaV;
    for (int j = 0; j < kMlaV; ++j)
      out[j] = table.dot_f32(w_uk + (kMlaNope + int64_t{j}) * kMlaRank, o_lat.data(), kMlaRank);
  }
}

void run_mla(const KernelTable& table, const CpuFeatures& features, int threads, int reps,
             const std::vector<int64_t>& lengths, const std::vector<int64_t>& contexts,
             const std::vector<int64_t>& decode_seqs) {
  std::printf(
      "MLA at DeepSeek-V3's shape: %d q heads on one latent K/V head of %d + %d, nope %d, v %d, bf16 "
      "latent cache of %d-position blocks; kernels %s\n",
      kMlaHeads, kMlaRank, kMlaRope, kMlaNope, kMlaV, kBlock, isa_name(table.isa));
  const double peak = register_fma_peak_gflops(table.isa, features, threads);
  std::printf("register FMA peak (%s, %d threads): %.1f GFLOP/s\n", isa_name(table.isa), threads, peak);
  for (int64_t len : lengths) {
    MlaSetup st(1, len, len);
    // kv_b_proj over every position (k_nope and v of every head), then q·k over nope + rope and p·v.
    const double gflop = (2.0 * len * kMlaRank * kMlaHeads * (kMlaNope + kMlaV) +
                          2.0 * st.pairs() * kMlaHeads * (kMlaQk + kMlaV)) *
                         1e-9;
    const double t_new = median_seconds(reps, [&] { st.run(table); });
    const double t_old = median_seconds(std::max(1, reps / 2), [&] { mla_expanded_rows(table, st); });
    std::printf(
        "mla prefill L=%-5lld expanded: blocked %9.2f ms %7.1f GFLOP/s = %5.1f %% of peak | row loop (main) "
        "%9.2f ms %7.1f GFLOP/s = %5.1f %% | %.2fx  load %.2f\n",
        static_cast<long long>(len), t_new * 1e3, gflop / t_new, 100 * gflop / t_new / peak, t_old * 1e3,
        gflop / t_old, 100 * gflop / t_old / peak, t_old / t_new, load_average());
  }
  const double bandwidth = measure_read_bandwidth_gbs();
  std::printf("read bandwidth probe: %.1f GB/s\n", bandwidth);
  for (int64_t seqs : decode_seqs)
    for (int64_t len : contexts) {
      MlaSetup st(seqs, len, 1);
      // Bytes: the latent rows plus W_UK and W_UV in f32; FLOPs: the absorption products and q·k over
      // kv_lora + rope, p·v over kv_lora for every head.
      const double bytes = static_cast<double>(seqs) * len * kMlaLatent * sizeof(bf16) +
                           double{kMlaHeads} * (kMlaNope + kMlaV) * kMlaRank * sizeof(float);
      const double gflop = (2.0 * seqs * kMlaHeads * (kMlaNope + kMlaV) * kMlaRank +
                            2.0 * st.pairs() * kMlaHeads * (kMlaLatent + kMlaRank)) *
                           1e-9;
      const double t_new = median_seconds(reps, [&] { st.run(table); });
      const double t_old = median_seconds(reps, [&] { mla_absorbed_rows(table, st); });
      std::printf(
          "mla decode %2lld seqs x ctx %-5lld absorbed: blocked %8.2f ms %6.1f GB/s = %5.1f %% of bw, %6.1f "
          "GFLOP/s = %5.1f %% of peak | dot/axpy loop (main) %8.2f ms %6.1f GFLOP/s | %.2fx  load %.2f\n",
          static_cast<long long>(seqs), static_cast<long long>(len), t_new * 1e3, bytes / t_new * 1e-9,
          100 * bytes / t_new * 1e-9 / bandwidth, gflop / t_new, 100 * gflop / t_new / peak, t_old * 1e3,
          gflop / t_old, t_old / t_new, load_average());
    }
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, reps = 5;
  std::string mode = "gqa", isa_flag;
  std::vector<int64_t> lengths = {512, 2048}, contexts, decode_seqs;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--threads")
      threads = std::stoi(value);
    else if (flag == "--reps")
      reps = std::stoi(value);
    else if (flag == "--lengths")
      lengths = parse_list(value);
    else if (flag == "--contexts")
      contexts = parse_list(value);
    else if (flag == "--decode-seqs")
      decode_seqs = parse_list(value);
    else if (flag == "--mode" && (value == "gqa" || value == "mla"))
      mode = value;
    else if (flag == "--isa")
      isa_flag = value;
    else {
      std::fprintf(stderr, "bench_attention: unknown flag or value: %s %s\n", flag.c_str(), value.c_str());
      return 2;
    }
  }
  omp_set_num_threads(threads);
  const CpuFeatures features = detect_cpu_features();
  std::printf("cpu features: %s; %d threads; medians of %d runs\n", features.str().c_str(), threads, reps);
  const KernelTable& best =
      isa_flag.empty() ? best_kernel_table(features) : kernel_table(parse_isa(isa_flag), features);
  if (mode == "mla") {
    run_mla(best, features, threads, reps, lengths,
            contexts.empty() ? std::vector<int64_t>{512, 4096} : contexts,
            decode_seqs.empty() ? std::vector<int64_t>{1, 8, 16} : decode_seqs);
    return 0;
  }
  std::printf("shape: %d q heads, %d kv heads, head_dim %d, bf16 cache, %d-position blocks\n", kHeads,
              kKvHeads, kDim, kBlock);
  std::vector<Isa> levels;
  for (Isa isa : {Isa::avx2, Isa::avx512})
    if (isa_supported(features, isa)) levels.push_back(isa);
  if (contexts.empty()) contexts = lengths;
  if (decode_seqs.empty()) decode_seqs = {16};

  for (int64_t len : lengths) {
    Setup st(1, len, len);
    const double gflop = st.flops() * 1e-9;
    for (Isa isa : levels) {
      const KernelTable& table = kernel_table(isa, features);
      const double peak = register_fma_peak_gflops(isa, features, threads);
      const double t = median_seconds(reps, [&] { attention(table, st.args); });
      std::printf(
          "prefill L=%-5lld %-8s %8.2f ms  %7.1f GFLOP/s = %5.1f %% of the %s FMA peak (%.1f GFLOP/s)  "
          "load %.2f\n",
          static_cast<long long>(len), isa_name(isa), t * 1e3, gflop / t, 100.0 * gflop / t / peak,
          isa_name(isa), peak, load_average());
    }
    const double t_new = median_seconds(reps, [&] { attention(best, st.args); });
    const double t_old = median_seconds(std::max(1, reps / 2), [&] { row_at_a_time(best, st); });
    std::printf(
        "prefill L=%-5lld row-at-a-time loop (replaced) %8.2f ms  %7.1f GFLOP/s; blocked kernel %.2fx "
        "faster  load %.2f\n",
        static_cast<long long>(len), t_old * 1e3, gflop / t_old, t_old / t_new, load_average());
  }

  const double bandwidth = measure_read_bandwidth_gbs();
  for (int64_t seqs : decode_seqs)
    for (int64_t len : contexts) {
      Setup st(seqs, len, 1);
      const double bytes = static_cast<double>(seqs) * len * kKvHeads * kDim * 2 * sizeof(bf16);
      const double t = median_seconds(reps, [&] { attention(best, st.args); });
      std::printf(
          "decode %lld seqs x context %-5lld %-8s %8.3f ms  %6.1f GB/s of K/V = %5.1f %% of the read "
          "bandwidth (%.1f GB/s)  load %.2f\n",
          static_cast<long long>(seqs), static_cast<long long>(len), isa_name(best.isa), t * 1e3,
          bytes / t * 1e-9, 100.0 * bytes / t * 1e-9 / bandwidth, bandwidth, load_average());
    }
  return 0;
}
