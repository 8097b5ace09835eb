// GEMM benchmark: each kernel variant this CPU runs, at MoE expert shapes, on 1 and 2 threads, against
// (a) a register-only FMA loop (the machine's FMA peak), (b) the in-cache GEMM probe of gemm_probe.hpp and
// (c) the peers built in, in the same run on the same buffers: oneDNN's matmul (f32 and bf16) and OpenBLAS's
// cblas_sgemm (f32), each on the same number of threads. Prints medians.
//
//   gemm_bench [--threads 1,2] [--reps 5] [--shapes 2048x2048x2048:NT,8192x2048x2048:NN] [--dtypes f32,bf16]
//
// Built by CMake when libdnnl-dev or libopenblas-dev is installed (target gemm_bench).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/cpu/variants.hpp"
#include "kernels/gemm_probe.hpp"
#include "kernels/register_fma_peak.hpp"
#ifdef XMOE_HAVE_DNNL
#include <oneapi/dnnl/dnnl.hpp>
#endif
#ifdef XMOE_HAVE_OPENBLAS
#include <cblas.h>
extern "C" void openblas_set_num_threads(int);  // OpenBLAS's own; not in every cblas.h
#endif

namespace {

using namespace xmoe;
using namespace xmoe::kernels;

struct BenchShape {
  int64_t m, n, k;
  bool ta, tb;
  std::string str() const {
    return std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) + ":" + (ta ? "T" : "N") +
           (tb ? "T" : "N");
  }
};

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, sep);)
    if (!item.empty()) out.push_back(item);
  return out;
}

BenchShape parse_shape(const std::string& s) {
  BenchShape b{};
  char ta = 'N', tb = 'N';
  if (std::sscanf(s.c_str(), "%ldx%ldx%ld:%c%c", &b.m, &b.n, &b.k, &ta, &tb) < 3) {
    std::fprintf(stderr, "bad shape '%s' (want MxNxK[:NT])\n", s.c_str());
    std::exit(2);
  }
  b.ta = ta == 'T';
  b.tb = tb == 'T';
  return b;
}

// Median seconds per call of `fn` over `reps` timed calls after one warm-up.
double median_seconds(const std::function<void()>& fn, int reps) {
  fn();
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

template <class T>
std::vector<T> random_values(int64_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<T> v(static_cast<size_t>(count));
  for (auto& x : v) x = T(dist(rng));
  return v;
}

template <class In>
GemmArgs<In, float> make_args(const BenchShape& s, const std::vector<In>& a, const std::vector<In>& b,
                              std::vector<float>& c) {
  GemmArgs<In, float> g;
  g.m = s.m, g.n = s.n, g.k = s.k;
  g.a = a.data(), g.lda = s.ta ? s.m : s.k, g.trans_a = s.ta;
  g.b = b.data(), g.ldb = s.tb ? s.k : s.n, g.trans_b = s.tb;
  g.c = c.data(), g.ldc = s.n;
  return g;
}

#ifdef XMOE_HAVE_DNNL
// oneDNN matmul over the same buffers; transposes are expressed as strides, as a caller would.
template <class In>
double onednn_seconds(const BenchShape& s, const std::vector<In>& a, const std::vector<In>& b,
                      std::vector<float>& c, int reps) {
  using dt = dnnl::memory::data_type;
  const dt in_type = std::is_same_v<In, float> ? dt::f32 : dt::bf16;
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  const dnnl::memory::desc a_md({s.m, s.k}, in_type,
                                s.ta ? dnnl::memory::dims{1, s.m} : dnnl::memory::dims{s.k, 1});
  const dnnl::memory::desc b_md({s.k, s.n}, in_type,
                                s.tb ? dnnl::memory::dims{1, s.k} : dnnl::memory::dims{s.n, 1});
  const dnnl::memory::desc c_md({s.m, s.n}, dt::f32, dnnl::memory::dims{s.n, 1});
  const dnnl::matmul::desc desc(a_md, b_md, c_md);
  const dnnl::matmul::primitive_desc pd(desc, engine);
  const dnnl::matmul prim(pd);
  dnnl::memory am(a_md, engine, const_cast<In*>(a.data()));
  dnnl::memory bm(b_md, engine, const_cast<In*>(b.data()));
  dnnl::memory cm(c_md, engine, c.data());
  return median_seconds(
      [&] {
        prim.execute(stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
        stream.wait();
      },
      reps);
}
#endif

#ifdef XMOE_HAVE_OPENBLAS
// OpenBLAS sgemm over the same buffers (row-major, transposes as flags), on `threads` threads.
double openblas_seconds(const BenchShape& s, const std::vector<float>& a, const std::vector<float>& b,
                        std::vector<float>& c, int threads, int reps) {
  openblas_set_num_threads(threads);
  return median_seconds(
      [&] {
        cblas_sgemm(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans, s.tb ? CblasTrans : CblasNoTrans,
                    static_cast<int>(s.m), static_cast<int>(s.n), static_cast<int>(s.k), 1.0f, a.data(),
                    static_cast<int>(s.ta ? s.m : s.k), b.data(), static_cast<int>(s.tb ? s.k : s.n), 0.0f,
                    c.data(), static_cast<int>(s.n));
      },
      reps);
}
#endif

struct Row {
  std::string name;
  double gflops;
};

template <class In>
void bench_shape(const BenchShape& s,
                 const std::vector<std::pair<std::string, void (*)(const GemmArgs<In, float>&)>>& variants,
                 double peak, double probe, int threads, int reps) {
  const auto a = random_values<In>(s.m * s.k, 1), b = random_values<In>(s.k * s.n, 2);
  std::vector<float> c(static_cast<size_t>(s.m * s.n));
  const double flops = 2.0 * static_cast<double>(s.m) * static_cast<double>(s.n) * static_cast<double>(s.k);
  std::vector<Row> peers;
#ifdef XMOE_HAVE_DNNL
  peers.push_back({"onednn", flops / onednn_seconds(s, a, b, c, reps) / 1e9});
#endif
#ifdef XMOE_HAVE_OPENBLAS
  if constexpr (std::is_same_v<In, float>)
    peers.push_back({"openblas", flops / openblas_seconds(s, a, b, c, threads, reps) / 1e9});
#endif
  (void)threads;
  double best_peer = 0;
  for (const Row& p : peers) best_peer = std::max(best_peer, p.gflops);
  std::vector<Row> rows;
  for (const auto& [name, fn] : variants) {
    const GemmArgs<In, float> g = make_args(s, a, b, c);
    rows.push_back({name, flops / median_seconds([&] { fn(g); }, reps) / 1e9});
  }
  rows.insert(rows.end(), peers.begin(), peers.end());
  for (const Row& r : rows) {
    std::printf("  %-18s %-5s %-12s %8.1f GFLOP/s  %5.1f%% of FMA peak  %5.1f%% of probe", s.str().c_str(),
                std::is_same_v<In, float> ? "f32" : "bf16", r.name.c_str(), r.gflops, 100 * r.gflops / peak,
                100 * r.gflops / probe);
    if (best_peer > 0) std::printf("  %5.2fx best peer", r.gflops / best_peer);
    std::printf("\n");
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> threads = {1, 2};
  int reps = 5;
  std::vector<BenchShape> shapes;
  std::vector<std::string> dtypes = {"f32", "bf16"};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i], value = argv[i + 1];
    if (key == "--threads") {
      threads.clear();
      for (const auto& t : split(value, ',')) threads.push_back(std::atoi(t.c_str()));
    } else if (key == "--reps") {
      reps = std::max(1, std::atoi(value.c_str()));
    } else if (key == "--shapes") {
      for (const auto& s : split(value, ',')) shapes.push_back(parse_shape(s));
    } else if (key == "--dtypes") {
      dtypes = split(value, ',');
    } else {
      std::fprintf(stderr, "unknown option %s\n", key.c_str());
      return 2;
    }
  }
  if (shapes.empty()) {
    for (const char* s : {"2048x2048x2048:NT", "8192x2048x2048:NT", "8192x2048x2048:NN", "8192x2048x2048:TN",
                          "512x2048x2048:NT", "64x2048x2048:NT"})
      shapes.push_back(parse_shape(s));
  }

  const CpuFeatures f = detect_cpu_features();
  std::printf("cpu: %s\n", f.str().c_str());
  std::vector<std::pair<std::string, void (*)(const GemmArgs<float, float>&)>> f32_variants;
  std::vector<std::pair<std::string, void (*)(const GemmArgs<bf16, float>&)>> bf16_variants;
  KernelTable best;  // the GEMM entries kernel_table.cpp would pick for this CPU
  best.gemm_f32 = reference::gemm_f32, best.gemm_bf16 = reference::gemm_bf16;
  if (f.has_avx2()) {
    f32_variants.push_back({"avx2", avx2::gemm_f32});
    bf16_variants.push_back({"avx2", avx2::gemm_bf16});
    best.gemm_f32 = avx2::gemm_f32, best.gemm_bf16 = avx2::gemm_bf16;
  }
  if (f.has_avx512()) {
    f32_variants.push_back({"avx512", avx512::gemm_f32});
    bf16_variants.push_back({"avx512", avx512::gemm_bf16});
    best.gemm_f32 = avx512::gemm_f32, best.gemm_bf16 = avx512::gemm_bf16;
  }
  if (f.has_avx512_bf16()) {
    bf16_variants.push_back({"avx512_bf16", avx512_bf16::gemm_bf16});
    best.gemm_bf16 = avx512_bf16::gemm_bf16;
  }

  for (int t : threads) {
    omp_set_num_threads(t);
    const double f32_peak = register_fma_peak_gflops(f.has_avx512() ? Isa::avx512 : Isa::avx2, f, t);
    const double bf16_peak = f.has_avx512_bf16() ? register_bf16_dot_peak_gflops(f, t) : f32_peak;
    const double f32_probe = measure_fma_peak_gflops(best, DType::f32);
    const double bf16_probe = measure_fma_peak_gflops(best, DType::bf16);
    std::printf(
        "threads=%d  FMA peak: f32 %.1f, bf16 %.1f GFLOP/s;  in-cache GEMM probe: f32 %.1f, bf16 %.1f\n", t,
        f32_peak, bf16_peak, f32_probe, bf16_probe);
    for (const BenchShape& s : shapes) {
      for (const std::string& d : dtypes) {
        if (d == "f32") bench_shape<float>(s, f32_variants, f32_peak, f32_probe, t, reps);
        if (d == "bf16") bench_shape<bf16>(s, bf16_variants, bf16_peak, bf16_probe, t, reps);
      }
    }
    std::fflush(stdout);
  }
  return 0;
}
