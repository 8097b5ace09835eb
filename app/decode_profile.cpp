#include "decode_profile.hpp"

#include <omp.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/linear.hpp"
#include "kernels/read_bandwidth.hpp"
#include "llm/checkpoint.hpp"
#include "llm/layers/weights.hpp"
#include "moe/packed_experts.hpp"
#include "stats.hpp"
#include "util/clock.hpp"
#include "weight_copies.hpp"
#include "xmoe/error.hpp"

namespace xmoe::app {

namespace {

using kernels::PackedWeight;

// The calling thread's CPU time: with one thread, the time the ops ran rather than the time they waited for a
// core on a loaded machine.
double thread_now() {
  return cpu_seconds(CLOCK_THREAD_CPUTIME_ID);
}

// /proc/loadavg's first three fields ("?" where it cannot be read).
std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string one, five, fifteen;
  if (!(in >> one >> five >> fifteen)) return "?";
  return one + " " + five + " " + fifteen;
}

// Decimal megabytes, as generate prints weights per token.
double mb(size_t bytes) {
  return static_cast<double>(bytes) / 1e6;
}

struct Layer {
  std::vector<PackedWeight> attention;  // q, k, v, o
  PackedWeight router;
  std::unique_ptr<moe::PackedSwigluExperts> experts;
  std::vector<PackedWeight> dense;  // gate, up, down of a dense MLP layer
};

// madvise takes whole pages: the advice goes to every page [p, p + bytes) touches, neighbours' included.
void advise(const std::byte* p, size_t bytes, int advice, size_t& failures, int& first_errno) {
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto b = reinterpret_cast<uintptr_t>(p) / page * page;
  const auto e = (reinterpret_cast<uintptr_t>(p) + bytes + page - 1) / page * page;
  if (::madvise(reinterpret_cast<void*>(b), e - b, advice) != 0 && failures++ == 0) first_errno = errno;
}

}  // namespace

int run_decode_profile(const kernels::KernelTable& table, const DecodeProfileOptions& o) {
  XMOE_CHECK(!o.thread_clock || omp_get_max_threads() == 1,
             "linear-bench --model: --clock thread needs --threads 1");
  const auto now = o.thread_clock ? thread_now : wall_seconds;
  const llm::Checkpoint ckpt = llm::Checkpoint::open(o.model);
  const llm::ModelConfig& c = ckpt.config();
  XMOE_CHECK(c.num_experts > 0 && c.num_experts_per_tok > 0, "linear-bench --model: ", o.model,
             " is not a mixture-of-experts checkpoint (num_experts ", c.num_experts, ")");
  const int64_t H = c.hidden_size, D = c.head_dim, I = c.moe_intermediate_size;
  const int E = c.num_experts, K = c.num_experts_per_tok;
  llm::WeightLoader loader(ckpt, DType::bf16);
  const double t_load = wall_seconds();
  std::vector<Layer> layers(static_cast<size_t>(c.num_hidden_layers));
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    Layer& L = layers[static_cast<size_t>(l)];
    const std::string p = "model.layers." + std::to_string(l) + ".";
    L.attention = {loader.matrix(p + "self_attn.q_proj.weight", c.num_attention_heads * D, H),
                   loader.matrix(p + "self_attn.k_proj.weight", c.num_key_value_heads * D, H),
                   loader.matrix(p + "self_attn.v_proj.weight", c.num_key_value_heads * D, H),
                   loader.matrix(p + "self_attn.o_proj.weight", H, c.num_attention_heads * D)};
    if (c.is_sparse_layer(l)) {
      L.router = loader.matrix(p + "mlp.gate.weight", E, H);
      std::vector<moe::SwigluWeights> experts(static_cast<size_t>(E));
      for (int e = 0; e < E; ++e) {
        const std::string q = p + "mlp.experts." + std::to_string(e) + ".";
        auto& w = experts[static_cast<size_t>(e)];
        w.gate = loader.matrix(q + "gate_proj.weight", I, H);
        w.up = loader.matrix(q + "up_proj.weight", I, H);
        w.down = loader.matrix(q + "down_proj.weight", H, I);
      }
      L.experts = std::make_unique<moe::PackedSwigluExperts>(std::move(experts), table);
    } else {
      const int64_t F = c.intermediate_size;
      L.dense = {loader.matrix(p + "mlp.gate_proj.weight", F, H),
                 loader.matrix(p + "mlp.up_proj.weight", F, H),
                 loader.matrix(p + "mlp.down_proj.weight", H, F)};
    }
  }
  const PackedWeight lm_head = c.tie_word_embeddings
                                   ? loader.matrix("model.embed_tokens.weight", c.vocab_size, H)
                                   : loader.matrix("lm_head.weight", c.vocab_size, H);
  std::fprintf(stderr, "loaded %s views in %.2f s\n", o.model.c_str(), wall_seconds() - t_load);

  // Every weight a step may read (codes and scales), for madvise and paging in.
  std::vector<PackedWeight> all;
  for (const Layer& L : layers) {
    all.insert(all.end(), L.attention.begin(), L.attention.end());
    all.insert(all.end(), L.dense.begin(), L.dense.end());
    if (L.experts) {
      all.push_back(L.router);
      for (int e = 0; e < E; ++e) {
        const auto& w = L.experts->expert(e);
        all.insert(all.end(), {w.gate, w.up, w.down});
      }
    }
  }
  all.push_back(lm_head);

  // madvise over every weight the step reads (codes and scales), page-aligned.
  if (o.madvise != "none") {
    const int advice = o.madvise == "hugepage"     ? MADV_HUGEPAGE
                       : o.madvise == "sequential" ? MADV_SEQUENTIAL
                       : o.madvise == "willneed"   ? MADV_WILLNEED
                                                   : -1;
    XMOE_CHECK(advice >= 0, "linear-bench: unknown --madvise ", o.madvise);
    size_t failures = 0, calls = 0;
    int first_errno = 0;
    const double t0 = wall_seconds();
    const auto each = [&](const PackedWeight& w) {
      if (w.data == nullptr) return;
      ++calls;
      advise(w.data, static_cast<size_t>(w.rows * w.row_bytes), advice, failures, first_errno);
      if (w.scales != nullptr)
        advise(w.scales, w.bytes() - static_cast<size_t>(w.rows * w.row_bytes), advice, failures,
               first_errno);
    };
    for (const PackedWeight& w : all) each(w);
    std::fprintf(stderr, "madvise %s over %zu weights: %zu calls failed (%s), %.2f s\n", o.madvise.c_str(),
                 calls, failures, failures ? std::strerror(first_errno) : "ok", wall_seconds() - t0);
  }

  // Page every weight in (and map it) before timing, as generate --warmup does: the first touch of a page
  // would time the disk or the page-fault path, not the decode kernels.
  {
    const double t0 = wall_seconds();
    uint64_t sum = 0;
    const auto touch = [&sum](const std::byte* p, size_t n) {
      for (size_t i = 0; i < n; i += 4096) sum += static_cast<uint8_t>(p[i]);
    };
    for (const PackedWeight& w : all) {
      if (w.data == nullptr) continue;
      const auto n = static_cast<size_t>(w.rows * w.row_bytes);
      touch(w.data, n);
      if (w.scales != nullptr) touch(w.scales, w.bytes() - n);
    }
    std::fprintf(stderr, "paged in %zu weights in %.2f s (checksum %llu)\n", all.size(), wall_seconds() - t0,
                 static_cast<unsigned long long>(sum));
  }
  // Every weight decoded once (one x row), as a generation's prompt and first steps have decoded them by the
  // time its steps reach their steady state: the FP8 decodes then trust the rows they found free of NaN
  // codes (PackedWeight::nan_free_rows), which the steps below, each routed to other experts, would
  // otherwise still be checking.
  {
    const double t0 = wall_seconds();
    int64_t widest = 0, tallest = 0;
    for (const PackedWeight& w : all) {
      widest = std::max(widest, w.cols);
      tallest = std::max(tallest, w.rows);
    }
    const std::vector<float> zeros(static_cast<size_t>(widest), 0.0f);
    std::vector<float> out(static_cast<size_t>(tallest));
    for (const PackedWeight& w : all)
      if (w.data != nullptr) kernels::linear_forward(table, w, zeros.data(), 1, out.data());
    std::fprintf(stderr, "decoded every weight once in %.2f s\n", wall_seconds() - t0);
  }
  // Files cached in 4 KiB pages stream slower than in 2 MiB ones (io/page_cache.hpp; generate and serve read
  // them again, --page-cache).
  const llm::Checkpoint::HugePages huge = ckpt.huge_pages();
  std::fprintf(stderr, "checkpoint files mapped in 2 MiB pages: %.2f of %.2f GB\n", mb(huge.mapped) / 1e3,
               mb(huge.mappable) / 1e3);
  const double probe = kernels::measure_read_bandwidth_gbs();
  // The same streaming read over the mapped file: the lm_head's bytes (one contiguous tensor).
  const size_t head_bytes = static_cast<size_t>(lm_head.rows * lm_head.row_bytes);
  const double mapped_probe =
      head_bytes >= (size_t{64} << 20)
          ? kernels::measure_read_bandwidth_gbs(lm_head.data, head_bytes, 5, o.thread_clock)
          : 0.0;

  // One decode step's weight-reading ops at batch 1, layer after layer. Each layer routes x to K experts
  // that change from step to step (as tokens do), so the experts stream from DRAM.
  enum Class { kAttention, kRouter, kExperts, kExpertMajor, kDense, kLmHead, kClasses };
  const char* names[kClasses] = {"attention q/k/v/o",      "router",    "routed experts",
                                 "experts, 1 thread each", "dense mlp", "lm_head"};
  std::vector<double> seconds[kClasses];
  double bytes[kClasses] = {};
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(std::max<int64_t>(H, c.num_attention_heads * D)));
  for (auto& v : x) v = normal(rng);
  std::vector<float> xk(static_cast<size_t>(K * H)), yk(static_cast<size_t>(K * H)),
      y(static_cast<size_t>(std::max<int64_t>({c.vocab_size, c.num_attention_heads * D, E,
                                               c.intermediate_size > 0 ? c.intermediate_size : 1, H})));
  for (int j = 0; j < K; ++j) std::copy(x.begin(), x.begin() + H, xk.begin() + j * H);
  std::vector<float> act(static_cast<size_t>(std::max<int64_t>(c.intermediate_size, 1)));
  std::vector<moe::ExpertRange> ranges(static_cast<size_t>(K)), other(static_cast<size_t>(K));
  std::vector<float> gu(static_cast<size_t>(K * 2 * I));
  const auto step = [&](int s, double* t) {
    const auto timed = [&](Class cl, const auto& run) {
      const double t0 = now();
      run();
      t[cl] += now() - t0;
    };
    for (size_t l = 0; l < layers.size(); ++l) {
      const Layer& L = layers[l];
      timed(kAttention, [&] {
        for (const auto& w : L.attention) kernels::linear_forward(table, w, x.data(), 1, y.data());
      });
      if (L.experts) {
        timed(kRouter, [&] { kernels::linear_forward(table, L.router, x.data(), 1, y.data()); });
        for (int j = 0; j < K; ++j) {
          const int e = (j * (E / K) + s * 5 + static_cast<int>(l) * 3) % E;
          ranges[static_cast<size_t>(j)] = {e, j, j + 1};
        }
        // The same products scheduled expert-major: each thread runs whole experts (gate, up, activation,
        // down), so a layer has one join instead of a barrier between gate/up and down, and each call
        // streams a whole matrix. Other experts than the model's schedule gets (neither finds the other's in
        // cache), and the two go first on alternate steps (A/B).
        // (e + E / 2 would land on the model's own set whenever E / K divides E / 2: 128 experts, top 8.)
        std::vector<char> taken(static_cast<size_t>(E), 0);
        for (const moe::ExpertRange& rg : ranges) taken[static_cast<size_t>(rg.expert)] = 1;
        for (int j = 0; j < K; ++j) {
          const auto jj = static_cast<size_t>(j);
          other[jj] = ranges[jj];
          int e = (ranges[jj].expert + E / 2) % E;
          for (int tries = 0; tries < E && taken[static_cast<size_t>(e)]; ++tries) e = (e + 1) % E;
          taken[static_cast<size_t>(e)] = 1;  // E < 2K: some overlap is unavoidable; the loop ends anyway
          other[jj].expert = e;
        }
        const auto model_schedule = [&] {
          timed(kExperts, [&] { L.experts->forward_rows(xk.data(), ranges, K, yk.data()); });
        };
        const auto expert_major = [&] {
          timed(kExpertMajor, [&] {
#pragma omp parallel for schedule(static) num_threads(omp_get_max_threads())
            for (int j = 0; j < K; ++j) {
              const moe::SwigluWeights& w =
                  L.experts->expert(static_cast<int>(other[static_cast<size_t>(j)].expert));
              float* g = gu.data() + static_cast<size_t>(j) * 2 * I;
              kernels::linear_forward_columns(table, w.gate, xk.data() + j * H, 1, H, 0, I, g, I);
              kernels::linear_forward_columns(table, w.up, xk.data() + j * H, 1, H, 0, I, g + I, I);
              table.silu_mul_f32(g, g + I, g, I);
              kernels::linear_forward_columns(table, w.down, g, 1, I, 0, H, yk.data() + j * H, H);
            }
          });
        };
        if (s % 2 == 0) {
          model_schedule();
          expert_major();
        } else {
          expert_major();
          model_schedule();
        }
      } else {
        timed(kDense, [&] {
          kernels::linear_forward(table, L.dense[0], x.data(), 1, act.data());
          kernels::linear_forward(table, L.dense[1], x.data(), 1, act.data());
          kernels::linear_forward(table, L.dense[2], act.data(), 1, y.data());
        });
      }
    }
    timed(kLmHead, [&] { kernels::linear_forward(table, lm_head, x.data(), 1, y.data()); });
  };
  for (const Layer& L : layers) {
    for (const auto& w : L.attention) bytes[kAttention] += static_cast<double>(w.bytes());
    for (const auto& w : L.dense) bytes[kDense] += static_cast<double>(w.bytes());
    if (L.experts) {
      bytes[kRouter] += static_cast<double>(L.router.bytes());
      bytes[kExperts] += static_cast<double>(K * L.experts->expert(0).bytes());
      bytes[kExpertMajor] += static_cast<double>(K * L.experts->expert(0).bytes());
    }
  }
  bytes[kLmHead] = static_cast<double>(lm_head.bytes());
  std::vector<double> totals;
  // Another process on the cores shows as run-queue waits (the thread clock hides it; the bandwidth it takes
  // does not).
  const double wait0 = kernels::process_runqueue_wait_seconds(), wall0 = wall_seconds();
  for (int s = 0; s <= o.steps; ++s) {
    double t[kClasses] = {};
    step(s, t);
    if (s == 0) continue;  // warm-up
    double sum = 0;
    for (int cl = 0; cl < kClasses; ++cl) {
      seconds[cl].push_back(t[cl]);
      if (cl != kExpertMajor) sum += t[cl];  // an alternative schedule of the experts, not part of the step
    }
    totals.push_back(sum);
  }
  const double wait1 = kernels::process_runqueue_wait_seconds(), wall1 = wall_seconds();

  std::printf(
      "decode step at batch 1, %d threads, %s clock, %s: weight ops per class (medians of %d steps)\n",
      omp_get_max_threads(), o.thread_clock ? "thread" : "wall", o.model.c_str(), o.steps);
  std::printf(
      "read probe: %.2f GB/s anonymous buffer (wall clock); %.2f GB/s over the mapped lm_head (%.0f MB, "
      "%s clock)\n",
      probe, mapped_probe, mb(head_bytes), o.thread_clock ? "thread" : "wall");
  // The share is of the probe timed on the same clock: with the thread clock, the mapped-file stream.
  const double base = o.thread_clock && mapped_probe > 0 ? mapped_probe : probe;
  std::printf("%-24s %10s %10s %9s %9s (of %.2f GB/s)\n", "op class", "ms/step", "MB/step", "GB/s",
              "of probe", base);
  double all_bytes = 0;
  for (int cl = 0; cl < kClasses; ++cl) {
    if (bytes[cl] == 0) continue;
    if (cl != kExpertMajor) all_bytes += bytes[cl];
    const double t = median(seconds[cl]);
    std::printf("%-24s %10.3f %10.2f %9.2f %8.1f%%\n", names[cl], 1e3 * t, bytes[cl] / 1e6,
                bytes[cl] / t / 1e9, 100.0 * bytes[cl] / t / 1e9 / base);
  }
  const double total = median(totals);
  std::printf("%-24s %10.3f %10.2f %9.2f %8.1f%%\n", "step (model's experts)", 1e3 * total, all_bytes / 1e6,
              all_bytes / total / 1e9, 100.0 * all_bytes / total / 1e9 / base);

  if (o.compare_anonymous) {
    // The lm_head over an anonymous copy, A/B alternated with the mapped one.
    const WeightCopies copy = copy_weight(lm_head, 1);
    std::vector<double> mapped, anon;
    for (int s = 0; s <= o.steps; ++s) {
      double t0 = now();
      kernels::linear_forward(table, lm_head, x.data(), 1, y.data());
      const double tm = now() - t0;
      t0 = now();
      kernels::linear_forward(table, copy.views[0], x.data(), 1, y.data());
      const double ta = now() - t0;
      if (s == 0) continue;
      mapped.push_back(tm);
      anon.push_back(ta);
    }
    std::printf("lm_head alone: mapped %.3f ms (%.2f GB/s), anonymous copy %.3f ms (%.2f GB/s)\n",
                1e3 * median(mapped), bytes[kLmHead] / median(mapped) / 1e9, 1e3 * median(anon),
                bytes[kLmHead] / median(anon) / 1e9);
  }
  std::printf("read probe after: %.2f GB/s\n", kernels::measure_read_bandwidth_gbs());
  if (wait0 >= 0 && wait1 >= 0)
    std::printf(
        "cpu contention: threads waited for a CPU %.1f ms in the %d steps (%.1f %% of %d threads x "
        "%.3f s wall); load average %s\n",
        1e3 * (wait1 - wait0), o.steps + 1,
        100.0 * (wait1 - wait0) / ((wall1 - wall0) * omp_get_max_threads()), omp_get_max_threads(),
        wall1 - wall0, load_average().c_str());
  return 0;
}

}  // namespace xmoe::app
