#include "bench.hpp"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>
#include <vector>

#include "kernels/gemm_probe.hpp"
#include "kernels/kernels.hpp"
#include "kernels/register_fma_peak.hpp"
#include "stats.hpp"
#include "util/random.hpp"
#include "xmoe/communicator.hpp"
#include "xmoe/moe_layer.hpp"
#include "xmoe/training.hpp"
#ifdef XMOE_HAVE_MPI
#include "xmoe/mpi.hpp"
#endif

namespace xmoe::app {

namespace {

using Clock = std::chrono::steady_clock;

// The helloworld head: s[b, t] = Σ_m y[b, t, m]; loss = mean_b −log_softmax(s[b, :])[0]; returns the loss and
// fills dy = ∂loss/∂y (constant over m).
double nll_head(const Tensor& y, int64_t B, int64_t T, Tensor* dy) {
  const int64_t O = y.dim(2);
  std::vector<double> s(static_cast<size_t>(B * T), 0.0);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < B * T; ++r) {
    double acc = 0;
    for (int64_t m = 0; m < O; ++m) acc += y.get(r * O + m);
    s[static_cast<size_t>(r)] = acc;
  }
  double loss = 0;
  for (int64_t b = 0; b < B; ++b) {
    const double* sb = s.data() + b * T;
    const double mx = *std::max_element(sb, sb + T);
    double z = 0;
    for (int64_t t = 0; t < T; ++t) z += std::exp(sb[t] - mx);
    const double lse = mx + std::log(z);
    loss -= (sb[0] - lse) / static_cast<double>(B);
    if (dy) {
#pragma omp parallel for schedule(static)
      for (int64_t t = 0; t < T; ++t) {
        const double d = (std::exp(sb[t] - lse) - (t == 0 ? 1.0 : 0.0)) / static_cast<double>(B);
        for (int64_t m = 0; m < O; ++m) dy->set((b * T + t) * O + m, d);
      }
    }
  }
  return loss;
}

template <class V, class G>
void sgd_update(V* v, const G* g, int64_t n, double lr) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    if constexpr (std::is_same_v<V, bf16>)
      v[i] = bf16(static_cast<float>(static_cast<float>(v[i]) - lr * g[i]));
    else
      v[i] = static_cast<V>(v[i] - lr * g[i]);
  }
}

void sgd_step(MoeLayer& layer, double lr) {
  for (Parameter* p : layer.parameters()) {
    const int64_t n = p->value.numel();
    switch (p->value.dtype()) {
      case DType::f32:
        sgd_update(p->value.data<float>(), p->grad.data<float>(), n, lr);
        break;
      case DType::bf16:
        sgd_update(p->value.data<bf16>(), p->grad.data<float>(), n, lr);
        break;
      case DType::f64:
        sgd_update(p->value.data<double>(), p->grad.data<double>(), n, lr);
        break;
    }
  }
  layer.zero_grad();
}

// Tutel's parallel_type with sc ranks per expert: data → 1, model → sc, adaptive:R → R (which must be 0 or
// a divisor of sc; the layer checks).
int parse_parallel_type(const std::string& s, int sc) {
  if (s == "data") return 1;
  if (s == "model") return sc;
  if (s.rfind("adaptive:", 0) == 0) {
    try {
      size_t used = 0;
      const int r = std::stoi(s.substr(9), &used);
      if (used == s.size() - 9 && r >= 0) return std::min(r, sc);  // Tutel clamps R to [0, sc]
    } catch (const std::exception&) {
    }
  }
  throw Error("--parallel_type: expected adaptive:R (R >= 0), data or model, got '" + s + "'");
}

// Prints on rank 0 only.
template <class... Args>
void say(bool root, const char* fmt, Args... args) {
  if (!root) return;
  std::printf(fmt, args...);
  std::fflush(stdout);
}

double expert_flops(const BenchOptions& o, int64_t rows) {
  const double r = static_cast<double>(rows), m = static_cast<double>(o.model_dim),
               h = static_cast<double>(o.hidden_size);
  return o.expert_type == "swiglu" ? 2.0 * r * 3.0 * m * h : 2.0 * r * 2.0 * m * h;
}

}  // namespace

int run_bench(const BenchOptions& o) {
  if (o.threads > 0) omp_set_num_threads(o.threads);
#ifdef XMOE_HAVE_MPI
  std::optional<MpiSession> session;
  if (std::getenv("OMPI_COMM_WORLD_SIZE")) session.emplace();  // launched by mpirun
  std::shared_ptr<Communicator> world =
      session ? std::shared_ptr<Communicator>(session->world()) : make_local_communicator();
#else
  std::shared_ptr<Communicator> world = make_local_communicator();
#endif
  const int W = world->size();
  const bool root = world->rank() == 0;
  // Tutel's num_local_experts: n > 0 experts per rank (E = n·W), or n < 0 for E = W / |n| experts, each
  // sharded over |n| ranks.
  const int n = o.num_local_experts;
  XMOE_CHECK(n > 0 || (n < 0 && W % -n == 0), "--num_local_experts: ", n,
             " must be positive, or negative with |n| dividing the ", W, " ranks");
  const int E = n > 0 ? n * W : W / -n, sc = n > 0 ? 1 : -n;
  XMOE_CHECK(o.top <= E, "--top: must be <= the number of experts (", E, " from --num_local_experts ", n,
             " and ", W, " ranks), got ", o.top);
  const int r = o.adaptive_r >= 0 ? o.adaptive_r : parse_parallel_type(o.parallel_type, sc);

  MoeConfig cfg;
  cfg.model_dim = o.model_dim;
  cfg.dtype = parse_dtype(o.dtype);
  cfg.gate.type = o.gate_type;
  cfg.gate.k = o.top;
  cfg.gate.capacity_factor = o.dropless ? 0.0 : o.capacity_factor;
  cfg.gate.gate_noise = o.gate_noise;
  cfg.experts.type = o.expert_type;
  cfg.experts.num_experts = E;
  cfg.a2a_overlap_degree = o.a2a_overlap_degree;
  cfg.adaptive_r = r;
  cfg.use_2dh = o.use_2dh;
  cfg.local_size = o.local_size;
  cfg.experts.hidden_size = o.hidden_size;
  cfg.experts.activation = o.activation;
  cfg.isa = o.isa;
  MoeLayer layer(cfg, world);

  int64_t expert_params = 0, gate_params = 0;
  for (Parameter* p : layer.parameters()) (p->is_expert ? expert_params : gate_params) += p->value.numel();
  say(root, "[Statistics] param count for MoE local_experts = %lld, param count for MoE gate = %lld.\n",
      static_cast<long long>(expert_params), static_cast<long long>(gate_params));
  say(root,
      "[Benchmark] world_size = %d, dtype = %s, model_dim = %lld, hidden_size = %lld, samples = %lld, "
      "num_local_experts = %d, topK = %d, capacity_factor = %g, execution = %s, mode = %s, device = cpu "
      "(kernels %s, %d threads), adaptive_r = %d, a2a_overlap_degree = %d, use_2dh = %d\n",
      W, o.dtype.c_str(), static_cast<long long>(o.model_dim), static_cast<long long>(o.hidden_size),
      static_cast<long long>(o.batch_size * o.num_tokens), o.num_local_experts, o.top,
      cfg.gate.capacity_factor, o.dropless ? "grouped" : "padded", o.eval ? "eval" : "train",
      layer.kernel_isa(), omp_get_max_threads(), r, o.a2a_overlap_degree, static_cast<int>(o.use_2dh));

  const Shape xs{o.batch_size, o.num_tokens, o.model_dim};
  Tensor x = Tensor::empty(xs, cfg.dtype);
  {
    const CounterRng rng(o.seed, static_cast<uint64_t>(world->rank()));
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < x.numel(); ++i) x.set(i, rng.normal(static_cast<uint64_t>(i)));
  }
  Tensor dy = Tensor::empty({o.batch_size, o.num_tokens, layer.output_dim()}, cfg.dtype);
  Switches sw;
  sw.training = !o.eval;
  sw.execution = o.dropless ? ExpertExecution::grouped : ExpertExecution::padded;

  const double flops_per_step = static_cast<double>(o.batch_size * o.num_tokens) *
                                static_cast<double>(o.model_dim) * static_cast<double>(o.hidden_size) * 4.0 *
                                (o.eval ? 1.0 : 3.0) * std::min(o.top, std::max(n, 1));
  std::optional<Adam> adam;
  if (o.optimizer == "adam") adam.emplace(AdamOptions{.lr = o.lr});
  double dt_max_ = 0;
  std::vector<double> comm_t, step_t, gate_t, route_t, enc_t, exp_t, dec_t, bwd_t, bwd_exp_t, exp_rate,
      bwd_exp_rate, fma_peak, exp_share, bwd_exp_share, step_share;
  // The register-only ceiling: f32 FMA chains, or for bf16 VDPBF16PS chains at AVX512-BF16 or AMX tiles at
  // the AMX level.
  const kernels::KernelTable& table =
      kernels::kernel_table(kernels::parse_isa(layer.kernel_isa()), kernels::detect_cpu_features());
  const kernels::CpuFeatures features = kernels::detect_cpu_features();
  const bool dot_bf16 = cfg.dtype == DType::bf16 && table.isa >= kernels::Isa::avx512_bf16;
  auto measure_peak = [&] {
    return dot_bf16 ? kernels::register_bf16_product_peak_gflops(table.isa, features, omp_get_max_threads())
                    : kernels::register_fma_peak_gflops(table.isa, features, omp_get_max_threads());
  };
  for (int step = 0; step < o.num_steps; ++step) {
    const auto t0 = Clock::now();
    ForwardResult r = layer.forward(x, sw);
    double loss = nll_head(r.y, o.batch_size, o.num_tokens, o.eval ? nullptr : &dy);
    loss += o.l_aux_wt * r.aux_loss;
    if (!o.eval) {
      layer.backward(dy, o.l_aux_wt);
      if (W > 1) average_shared_gradients(layer, *world);
      if (adam)
        adam->step(layer);
      else
        sgd_step(layer, o.lr);
    }
    double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    if (W > 1) world->all_reduce(&dt, &dt_max_, 1, ElementType::f64, ReduceOp::max), dt = dt_max_;
    say(root, "STEP-%d: loss = %.5f, step_time = %.6f sec, perf = %.2f tflops.\n", step, loss, dt,
        flops_per_step / dt / 1e12);
    if (step == 0 && o.num_steps > 1) continue;  // warm-up: buffers grow, pages fault in
    const PhaseTimes& pt = layer.last_times();
    int64_t rows = 0;
    for (int64_t e = 0; e < E; ++e) {  // E·C rows: L local experts × W sources × C
      const auto& rt = layer.last_routing();
      rows +=
          o.dropless ? std::min<int64_t>(rt.expert_counts[static_cast<size_t>(e)], rt.capacity) : rt.capacity;
    }
    step_t.push_back(dt);
    comm_t.push_back(pt.communication);
    gate_t.push_back(pt.gate);
    route_t.push_back(pt.routing);
    enc_t.push_back(pt.encode);
    exp_t.push_back(pt.experts);
    dec_t.push_back(pt.decode);
    exp_rate.push_back(expert_flops(o, rows) / pt.experts / 1e9);
    if (!o.eval) {
      bwd_t.push_back(pt.backward);
      bwd_exp_t.push_back(pt.backward_experts);
      bwd_exp_rate.push_back(2.0 * expert_flops(o, rows) / pt.backward_experts / 1e9);
    }
    // The peak right after each step (0.2 s), and each step's shares of it: on a shared machine the load
    // drifts over a run, and a ceiling measured once at the end would not be the one the step ran under.
    fma_peak.push_back(measure_peak());
    exp_share.push_back(exp_rate.back() / fma_peak.back());
    if (!o.eval) bwd_exp_share.push_back(bwd_exp_rate.back() / fma_peak.back());
    step_share.push_back(flops_per_step / dt / 1e9 / fma_peak.back());
  }
  const double med = median(step_t);
  say(root, "[Summary] Median step_time = %.6f sec over %zu steps after warm-up, perf = %.2f tflops.\n", med,
      step_t.size(), flops_per_step / med / 1e12);
  const double rd = median(route_t) + median(enc_t) + median(dec_t);
  say(root,
      "[Phases] median seconds: gate %.4f, routing %.4f, encode %.4f, experts %.4f, decode %.4f, backward "
      "%.4f "
      "(experts %.4f); routing+encode+decode = %.2f%% of the step\n",
      median(gate_t), median(route_t), median(enc_t), median(exp_t), median(dec_t), median(bwd_t),
      median(bwd_exp_t), 100.0 * rd / med);
  const double peak = kernels::measure_fma_peak_gflops(table, cfg.dtype);
  if (W > 1)
    say(root, "[Communication] median %.4f s per step = %.2f%% of the step (all-to-all, gathers; rank 0)\n",
        median(comm_t), 100.0 * median(comm_t) / med);
  say(root, "[Experts] forward %.1f GFLOP/s = %.1f%% of the measured GEMM peak %.1f GFLOP/s (%s)",
      median(exp_rate), 100.0 * median(exp_rate) / peak, peak, o.dtype.c_str());
  if (!o.eval)
    say(root, "; backward %.1f GFLOP/s = %.1f%%", median(bwd_exp_rate), 100.0 * median(bwd_exp_rate) / peak);
  say(root, "\n");
  // The register-only loop cannot read low the way the in-cache GEMM probe can (packing, cache misses), so
  // these shares are the kernels' true efficiency: medians of the per-step shares.
  say(root,
      "[FMA peak] register-only %s %.1f GFLOP/s (%s, %d threads, median of one after each step): experts "
      "forward %.1f%%",
      dot_bf16 ? kernels::bf16_product_peak_name(table.isa) : "f32 FMA", median(fma_peak),
      kernels::isa_name(table.isa), omp_get_max_threads(), 100.0 * median(exp_share));
  if (!o.eval) say(root, ", backward %.1f%%", 100.0 * median(bwd_exp_share));
  say(root, "; whole step %.1f GFLOP/s = %.1f%%\n", flops_per_step / med / 1e9, 100.0 * median(step_share));
  if (dot_bf16) {
    // bf16 products can outrun f32 FMAs: the same rates as multiples of the f32 FMA peak.
    const double f32_peak = kernels::register_fma_peak_gflops(table.isa, features, omp_get_max_threads());
    say(root, "[f32 FMA peak] register-only %.1f GFLOP/s: experts forward %.2fx", f32_peak,
        median(exp_rate) / f32_peak);
    if (!o.eval) say(root, ", backward %.2fx", median(bwd_exp_rate) / f32_peak);
    say(root, "; whole step %.2fx\n", flops_per_step / med / 1e9 / f32_peak);
  }

  if (o.measure_switching) {
    // Time the same configuration A when every call follows a switch (B, A, B, A, ...) and when it does not.
    Switches a = sw, b = sw;
    a.training = b.training = false;
    b.top_k = o.top > 1 ? 1 : std::min(2, E);
    b.capacity_factor = o.capacity_factor > 0 ? 0.0 : 1.0;
    // Interleaved (A, A*, B, A*: the starred calls are timed) so that machine drift hits both kinds alike.
    const int reps = 9;
    std::vector<double> steady, switched;
    auto time_forward = [&](const Switches& s) {
      const auto t0 = Clock::now();
      layer.forward(x, s);
      return std::chrono::duration<double>(Clock::now() - t0).count();
    };
    time_forward(a), time_forward(b);  // warm both
    const size_t warm_bytes = layer.workspace_bytes();
    for (int i = 0; i < reps; ++i) {
      time_forward(a);
      steady.push_back(time_forward(a));
      time_forward(b);
      switched.push_back(time_forward(a));
    }
    std::vector<double> diff;
    for (int i = 0; i < reps; ++i)
      diff.push_back(switched[static_cast<size_t>(i)] - steady[static_cast<size_t>(i)]);
    const double ms = median(steady), mw = median(switched), md = median(diff);
    say(root,
        "[Switching] forward right after a top_k/capacity_factor switch: median %.6f s, unswitched %.6f s; "
        "median "
        "paired difference %+.6f s = %+.2f%% of a forward; workspace %zu -> %zu bytes after warm-up\n",
        mw, ms, md, 100.0 * md / ms, warm_bytes, layer.workspace_bytes());
  }
  return 0;
}

}  // namespace xmoe::app
