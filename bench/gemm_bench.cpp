// GEMM benchmark: each kernel variant this CPU runs, at MoE expert shapes, on 1 and 2 threads, against
// (a) a register-only FMA loop (the machine's FMA peak), (b) the in-cache GEMM probe of gemm_probe.hpp and
// (c) the peers built in, in the same run on the same buffers: oneDNN's matmul (f32 and bf16) and OpenBLAS's
// cblas_sgemm (f32), each on the same number of threads. Contenders run interleaved, one call each per round,
// so load drift on a shared machine reaches them alike; prints medians and the median per-round ratio to the
// fastest peer. Each variant's share is of its own ceiling: TDPBF16PS's for amx (and oneDNN's bf16 where AMX
// is allowed), VDPBF16PS's for avx512_bf16 (and oneDNN's bf16 below AMX), the f32 FMA's for the rest
// (avx2/avx512 widen bf16 to f32 while packing).
//
//   gemm_bench [--threads 1,2] [--reps 5] [--shapes 8192x2048x2048:NN,...] [--dtypes f32,bf16]
//              [--clock wall|thread|process] [--variants ...] [--isa avx2|avx512|avx512_bf16|amx]
//              (--help lists the defaults)
//
// Built by CMake when libdnnl-dev or libopenblas-dev is installed (target gemm_bench).
#include <omp.h>
#include <time.h>
#include <unistd.h>

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
extern "C" char* openblas_get_corename();
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

// One contender in a shape's race: a name and a call over the shared buffers.
struct Contender {
  std::string name;
  std::function<void()> call;
  bool peer;
};

// Seconds per call of each contender over `reps` rounds after one warm-up call each; every round calls each
// contender once, in turn, so that a shared machine's load drift reaches all of them alike.
// `clock`: the wall clock, the calling thread's CPU time (1 thread only), or the process's CPU time per
// thread; the CPU clocks leave out the time a loaded machine kept threads off the cores.
std::vector<std::vector<double>> interleaved_seconds(const std::vector<Contender>& cs, int reps,
                                                     PeakClock clock, int threads) {
  auto now = [clock, threads] {
    if (clock == PeakClock::wall)
      return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
    timespec ts{};
    clock_gettime(clock == PeakClock::thread_cpu ? CLOCK_THREAD_CPUTIME_ID : CLOCK_PROCESS_CPUTIME_ID, &ts);
    const double cpu = static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
    return clock == PeakClock::process_cpu ? cpu / threads : cpu;
  };
  for (const Contender& c : cs) c.call();
  std::vector<std::vector<double>> t(cs.size());
  for (int r = 0; r < reps; ++r) {
    for (size_t i = 0; i < cs.size(); ++i) {
      const double t0 = now();
      cs[i].call();
      t[i].push_back(now() - t0);
    }
  }
  return t;
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
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
std::function<void()> onednn_call(const BenchShape& s, const std::vector<In>& a, const std::vector<In>& b,
                                  std::vector<float>& c) {
  using dt = dnnl::memory::data_type;
  const dt in_type = std::is_same_v<In, float> ? dt::f32 : dt::bf16;
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  const dnnl::memory::desc a_md({s.m, s.k}, in_type,
                                s.ta ? dnnl::memory::dims{1, s.m} : dnnl::memory::dims{s.k, 1});
  const dnnl::memory::desc b_md({s.k, s.n}, in_type,
                                s.tb ? dnnl::memory::dims{1, s.k} : dnnl::memory::dims{s.n, 1});
  const dnnl::memory::desc c_md({s.m, s.n}, dt::f32, dnnl::memory::dims{s.n, 1});
  const dnnl::matmul::desc desc(a_md, b_md, c_md);
  const dnnl::matmul::primitive_desc pd(desc, engine);
  auto stream = std::make_shared<dnnl::stream>(engine);
  auto prim = std::make_shared<dnnl::matmul>(pd);
  dnnl::memory am(a_md, engine, const_cast<In*>(a.data()));
  dnnl::memory bm(b_md, engine, const_cast<In*>(b.data()));
  dnnl::memory cm(c_md, engine, c.data());
  return [stream, prim, am, bm, cm] {
    prim->execute(*stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
    stream->wait();
  };
}
#endif

#ifdef XMOE_HAVE_OPENBLAS
// OpenBLAS sgemm over the same buffers (row-major, transposes as flags); its thread count is set by the
// caller.
std::function<void()> openblas_call(const BenchShape& s, const std::vector<float>& a,
                                    const std::vector<float>& b, std::vector<float>& c) {
  return [&s, &a, &b, &c] {
    cblas_sgemm(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans, s.tb ? CblasTrans : CblasNoTrans,
                static_cast<int>(s.m), static_cast<int>(s.n), static_cast<int>(s.k), 1.0f, a.data(),
                static_cast<int>(s.ta ? s.m : s.k), b.data(), static_cast<int>(s.tb ? s.k : s.n), 0.0f,
                c.data(), static_cast<int>(s.n));
  };
}
#endif

template <class In>
struct Variant {
  std::string name;
  void (*fn)(const GemmArgs<In, float>&);
  bool dot_bf16;       // runs VDPBF16PS, whose ceiling is the bf16 dot peak (else the f32 FMA peak)
  bool tiles = false;  // runs AMX TDPBF16PS, whose ceiling is the register-only AMX peak
};

struct Ceilings {
  double f32_fma, bf16_dot, probe;
  double amx = 0;  // the register-only TDPBF16PS peak where the contenders may run AMX
};

// Times every variant and peer at one shape, interleaved, and prints each one's median GFLOP/s, its share of
// the FMA peak and of the probe, and the median over rounds of its speed relative to the round's fastest
// peer.
// Empty `only` keeps every contender.
bool wanted(const std::vector<std::string>& only, const std::string& name) {
  return only.empty() || std::find(only.begin(), only.end(), name) != only.end();
}

template <class In>
void bench_shape(const BenchShape& s, const std::vector<Variant<In>>& variants, const Ceilings& ceil,
                 int reps, PeakClock clock, int threads, const std::vector<std::string>& only) {
  const auto a = random_values<In>(s.m * s.k, 1), b = random_values<In>(s.k * s.n, 2);
  std::vector<float> c(static_cast<size_t>(s.m * s.n));
  const double flops = 2.0 * static_cast<double>(s.m) * static_cast<double>(s.n) * static_cast<double>(s.k);
  const GemmArgs<In, float> g = make_args(s, a, b, c);
  std::vector<Contender> cs;
  std::vector<double> peaks;  // each contender's ceiling
  for (const Variant<In>& v : variants) {
    if (!wanted(only, v.name)) continue;
    cs.push_back({v.name, [fn = v.fn, &g] { fn(g); }, false});
    peaks.push_back(v.tiles ? ceil.amx : v.dot_bf16 ? ceil.bf16_dot : ceil.f32_fma);
  }
  // oneDNN's bf16 matmul runs AMX or VDPBF16PS where the CPU has it.
  const double peer_peak =
      std::is_same_v<In, bf16> ? (ceil.amx > 0 ? ceil.amx : ceil.bf16_dot) : ceil.f32_fma;
#ifdef XMOE_HAVE_DNNL
  if (wanted(only, "onednn")) {
    // oneDNN has no matmul for some type and ISA-cap pairs (bf16 under --isa avx2): it sits out that shape
    // instead of ending the run.
    try {
      cs.push_back({"onednn", onednn_call(s, a, b, c), true});
      peaks.push_back(peer_peak);
    } catch (const dnnl::error& e) {
      std::printf("  %-18s %-5s %-12s not run: oneDNN has no matmul for it at this ISA cap (%s)\n",
                  s.str().c_str(), std::is_same_v<In, float> ? "f32" : "bf16", "onednn", e.what());
    }
  }
#endif
#ifdef XMOE_HAVE_OPENBLAS
  if constexpr (std::is_same_v<In, float>) {
    if (wanted(only, "openblas")) {
      cs.push_back({"openblas", openblas_call(s, a, b, c), true});
      peaks.push_back(peer_peak);
    }
  }
#endif
  (void)peer_peak;
  const std::vector<std::vector<double>> t = interleaved_seconds(cs, reps, clock, threads);
  for (size_t i = 0; i < cs.size(); ++i) {
    const double gflops = flops / median_of(t[i]) / 1e9;
    std::printf("  %-18s %-5s %-12s %8.1f GFLOP/s  %5.1f%% of FMA peak  %5.1f%% of probe", s.str().c_str(),
                std::is_same_v<In, float> ? "f32" : "bf16", cs[i].name.c_str(), gflops,
                100 * gflops / peaks[i], 100 * gflops / ceil.probe);
    std::vector<double> vs_peer;
    for (int r = 0; r < reps; ++r) {
      double best_peer = 0;
      for (size_t j = 0; j < cs.size(); ++j)
        if (cs[j].peer) best_peer = std::max(best_peer, 1.0 / t[j][static_cast<size_t>(r)]);
      if (best_peer > 0) vs_peer.push_back(1.0 / t[i][static_cast<size_t>(r)] / best_peer);
    }
    if (!vs_peer.empty()) std::printf("  %5.2fx best peer", median_of(vs_peer));
    std::printf("\n");
  }
  std::fflush(stdout);
}

constexpr const char* kUsage =
    "usage: gemm_bench [--threads 1,2] [--reps 5] [--shapes MxNxK[:TT],...] [--dtypes f32,bf16]\n"
    "                  [--clock wall|thread|process] [--variants "
    "avx2,avx512,avx512_bf16,amx,onednn,openblas]\n"
    "                  [--isa avx2|avx512|avx512_bf16|amx]\n"
    "  isa: the highest level for our kernels and the peers alike (oneDNN's max CPU ISA, OpenBLAS's core\n"
    "  type: the program re-runs itself with OPENBLAS_CORETYPE set, which OpenBLAS reads when it loads)\n"
    "  clock thread: time the calling thread's CPU time (kernels and peaks; needs --threads 1), which\n"
    "  leaves out the time a loaded machine kept the thread waiting (the in-cache probe stays on the wall\n"
    "  clock); clock process: the process's CPU time per thread, the same for a team (it also leaves out\n"
    "  the time threads wait for each other, and counts OpenBLAS's spinning threads as busy, so use it to\n"
    "  compare builds of our kernels, not against OpenBLAS; run it with OMP_WAIT_POLICY=passive, or\n"
    "  threads spinning at barriers count as busy)\n"
    "  shapes: C[M,N] = op(A)[M,K] op(B)[K,N]; T after ':' transposes A, then B (default: the MoE layer's\n"
    "  expert shapes at Tutel's helloworld defaults, forward and backward, and smaller token counts)\n";

// Forward x·W (NN), backward dY·Wᵀ (NT) and the weight gradient Xᵀ·dY (TN, k = tokens) at 8192 tokens per
// expert (helloworld: 16 × 512 tokens, top-2 of 2 experts, capacity factor 1), then smaller expert batches.
constexpr const char* kDefaultShapes[] = {"8192x2048x2048:NN", "8192x2048x2048:NT", "2048x2048x8192:TN",
                                          "8192x2048x2048:TN", "2048x2048x2048:NT", "512x2048x2048:NT",
                                          "64x2048x2048:NT"};

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> threads = {1, 2};
  int reps = 5;
  std::vector<BenchShape> shapes;
  std::vector<std::string> dtypes = {"f32", "bf16"};
  PeakClock clock = PeakClock::wall;
  std::vector<std::string> only;  // --variants: the contenders to run (default all)
  const CpuFeatures f = detect_cpu_features();
  Isa cap = best_isa(f);  // --isa: the highest level any contender may run
  for (int i = 1; i < argc; i += 2) {
    const std::string key = argv[i];
    if (key == "--help" || key == "-h") {
      std::printf("%s", kUsage);
      return 0;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "option %s needs a value\n%s", key.c_str(), kUsage);
      return 2;
    }
    const std::string value = argv[i + 1];
    if (key == "--threads") {
      threads.clear();
      for (const auto& t : split(value, ',')) threads.push_back(std::atoi(t.c_str()));
    } else if (key == "--reps") {
      reps = std::max(1, std::atoi(value.c_str()));
    } else if (key == "--shapes") {
      for (const auto& s : split(value, ',')) shapes.push_back(parse_shape(s));
    } else if (key == "--dtypes") {
      dtypes = split(value, ',');
    } else if (key == "--variants") {
      only = split(value, ',');
    } else if (key == "--isa") {
      cap = std::min(parse_isa(value), best_isa(f));
    } else if (key == "--clock" && (value == "wall" || value == "thread" || value == "process")) {
      clock = value == "wall"     ? PeakClock::wall
              : value == "thread" ? PeakClock::thread_cpu
                                  : PeakClock::process_cpu;
    } else {
      std::fprintf(stderr, "unknown option %s\n%s", key.c_str(), kUsage);
      return 2;
    }
  }
  if (shapes.empty()) {
    for (const char* s : kDefaultShapes) shapes.push_back(parse_shape(s));
  }
  // A peer capped below its own best must be capped before it first runs. OpenBLAS picks its kernels when
  // the library loads, so the program runs itself again with the core type in its environment.
  const bool capped = cap < best_isa(f);
#ifdef XMOE_HAVE_OPENBLAS
  if (capped && std::getenv("OPENBLAS_CORETYPE") == nullptr) {
    setenv("OPENBLAS_CORETYPE", cap == Isa::avx2 ? "Haswell" : "SkylakeX", 1);
    execv("/proc/self/exe", argv);
    std::perror("gemm_bench: re-running with OPENBLAS_CORETYPE");
    return 1;
  }
#endif
#ifdef XMOE_HAVE_DNNL
  if (capped)
    dnnl::set_max_cpu_isa(cap == Isa::avx2     ? dnnl::cpu_isa::avx2
                          : cap == Isa::avx512 ? dnnl::cpu_isa::avx512_core
                                               : dnnl::cpu_isa::avx512_core_bf16);
#endif
  std::printf("cpu: %s, L2 %lld KiB; contenders capped at %s\n", f.str().c_str(),
              static_cast<long long>(f.l2_bytes / 1024), isa_name(cap));
#ifdef XMOE_HAVE_OPENBLAS
  std::printf("openblas core: %s\n", openblas_get_corename());
#endif
  std::vector<Variant<float>> f32_variants;
  std::vector<Variant<bf16>> bf16_variants;
  KernelTable best;  // the GEMM entries kernel_table.cpp would pick for this CPU
  best.gemm_f32 = reference::gemm_f32, best.gemm_bf16 = reference::gemm_bf16;
  if (f.has_avx2() && cap >= Isa::avx2) {
    f32_variants.push_back({"avx2", avx2::gemm_f32, false});
    bf16_variants.push_back({"avx2", avx2::gemm_bf16, false});
    best.gemm_f32 = avx2::gemm_f32, best.gemm_bf16 = avx2::gemm_bf16;
  }
  if (f.has_avx512() && cap >= Isa::avx512) {
    // "avx512": the op(B) blocking kernel_table.cpp picks for this CPU's L2; the other one races it.
    const KernelTable& picked = kernel_table(Isa::avx512, f);
    const bool l2 = picked.gemm_f32 == avx512::gemm_f32_l2_blocks;
    f32_variants.push_back({"avx512", picked.gemm_f32, false});
    bf16_variants.push_back({"avx512", picked.gemm_bf16, false});
    f32_variants.push_back({l2 ? "avx512_l3_blocks" : "avx512_l2_blocks",
                            l2 ? avx512::gemm_f32 : avx512::gemm_f32_l2_blocks, false});
    best.gemm_f32 = picked.gemm_f32, best.gemm_bf16 = picked.gemm_bf16;
  }
  if (f.has_avx512_bf16() && cap >= Isa::avx512_bf16) {
    bf16_variants.push_back({"avx512_bf16", avx512_bf16::gemm_bf16, true});
    best.gemm_bf16 = avx512_bf16::gemm_bf16;
  }
  if (f.has_amx_bf16() && cap >= Isa::amx) {
    bf16_variants.push_back({"amx", amx::gemm_bf16, false, true});
    best.gemm_bf16 = amx::gemm_bf16;
  }

  if (clock == PeakClock::thread_cpu && (threads.size() != 1 || threads[0] != 1)) {
    std::fprintf(stderr, "--clock thread needs --threads 1\n");
    return 2;
  }
  std::printf("clock: %s\n", clock == PeakClock::wall         ? "wall"
                             : clock == PeakClock::thread_cpu ? "calling thread's CPU time"
                                                              : "process CPU time per thread");
  for (int t : threads) {
    omp_set_num_threads(t);
#ifdef XMOE_HAVE_OPENBLAS
    openblas_set_num_threads(t);
#endif
    const double f32_probe = measure_fma_peak_gflops(best, DType::f32);
    const double bf16_probe = measure_fma_peak_gflops(best, DType::bf16);
    std::printf("threads=%d  in-cache GEMM probe: f32 %.1f, bf16 %.1f GFLOP/s\n", t, f32_probe, bf16_probe);
    for (const BenchShape& s : shapes) {
      // Re-measured before each shape: the load on a shared machine drifts over a run.
      Ceilings ceil{};
      ceil.f32_fma = register_fma_peak_gflops(cap >= Isa::avx512 ? Isa::avx512 : Isa::avx2, f, t, 0.2, clock);
      ceil.bf16_dot =
          cap >= Isa::avx512_bf16 ? register_bf16_dot_peak_gflops(f, t, 0.2, clock) : ceil.f32_fma;
      if (cap >= Isa::amx) ceil.amx = register_amx_bf16_peak_gflops(f, t, 0.2, clock);
      std::printf("%s  threads=%d  FMA peak: f32 %.1f, VDPBF16PS %.1f, TDPBF16PS (AMX) %.1f GFLOP/s\n",
                  s.str().c_str(), t, ceil.f32_fma, ceil.bf16_dot, ceil.amx);
      for (const std::string& d : dtypes) {
        if (d == "f32")
          ceil.probe = f32_probe, bench_shape<float>(s, f32_variants, ceil, reps, clock, t, only);
        if (d == "bf16")
          ceil.probe = bf16_probe, bench_shape<bf16>(s, bf16_variants, ceil, reps, clock, t, only);
      }
    }
  }
  return 0;
}
