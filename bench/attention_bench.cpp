// Attention benchmark at Qwen3-30B-A3B's shape (32 query heads, 4 KV heads, head_dim 128, bf16 paged cache
// of 16-position blocks), in one run:
//  * prefill of one L-token sequence (causal): GFLOP/s of each kernel level this CPU runs, as a share of the
//    register-only FMA peak of that level measured right before it, next to the loop it replaced (one query
//    head of one token at a time: dot products, a softmax, axpys through the kernel table);
//  * batched decode of S sequences at context L: GB/s of K/V read as a share of the DRAM read bandwidth
//    measured in the same run.
// Prints medians over --reps runs.
//
//   bench_attention [--threads 2] [--reps 5] [--lengths 512,2048] [--decode-seqs 16]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/attention.hpp"
#include "kernels/cpu_features.hpp"
#include "kernels/kernels.hpp"
#include "kernels/read_bandwidth.hpp"
#include "kernels/register_fma_peak.hpp"

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

// `seqs` sequences of `len` cached positions in shuffled bf16 blocks, with `rows` query rows each at the end.
struct Setup {
  std::vector<bf16> pool;
  std::vector<std::vector<const void*>> k_blocks, v_blocks;
  std::vector<float> q, out;
  std::vector<AttentionSequence> seqs;
  AttentionArgs args;
  int64_t len, rows;

  Setup(int64_t num_seqs, int64_t len_, int64_t rows_) : len(len_), rows(rows_) {
    const int64_t row = int64_t{kKvHeads} * kDim, per_block = kBlock * row;
    const int64_t blocks = (len + kBlock - 1) / kBlock;
    pool.resize(static_cast<size_t>(2 * num_seqs * blocks * per_block));
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    for (bf16& x : pool) x = bf16(uni(rng));
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
      for (int64_t j = 0; j < blocks; ++j) kb.push_back(pool.data() + order[next++] * per_block);
      for (int64_t j = 0; j < blocks; ++j) vb.push_back(pool.data() + order[next++] * per_block);
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

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, reps = 5;
  int64_t decode_seqs = 16;
  std::vector<int64_t> lengths = {512, 2048};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--threads")
      threads = std::stoi(value);
    else if (flag == "--reps")
      reps = std::stoi(value);
    else if (flag == "--lengths")
      lengths = parse_list(value);
    else if (flag == "--decode-seqs")
      decode_seqs = std::stoll(value);
    else {
      std::fprintf(stderr, "bench_attention: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  omp_set_num_threads(threads);
  const CpuFeatures features = detect_cpu_features();
  std::printf(
      "cpu features: %s; %d threads; shape: %d q heads, %d kv heads, head_dim %d, bf16 cache, "
      "%d-position blocks; medians of %d runs\n",
      features.str().c_str(), threads, kHeads, kKvHeads, kDim, kBlock, reps);
  std::vector<Isa> levels;
  for (Isa isa : {Isa::avx2, Isa::avx512})
    if (isa_supported(features, isa)) levels.push_back(isa);
  const KernelTable& best = best_kernel_table(features);

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
  for (int64_t len : lengths) {
    Setup st(decode_seqs, len, 1);
    const double bytes = static_cast<double>(decode_seqs) * len * kKvHeads * kDim * 2 * sizeof(bf16);
    const double t = median_seconds(reps, [&] { attention(best, st.args); });
    std::printf(
        "decode %lld seqs x context %-5lld %-8s %8.3f ms  %6.1f GB/s of K/V = %5.1f %% of the read "
        "bandwidth (%.1f GB/s)  load %.2f\n",
        static_cast<long long>(decode_seqs), static_cast<long long>(len), isa_name(best.isa), t * 1e3,
        bytes / t * 1e-9, 100.0 * bytes / t * 1e-9 / bandwidth, bandwidth, load_average());
  }
  return 0;
}
