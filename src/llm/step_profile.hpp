// Where an engine step's time goes, by op class, for `xmoe generate --profile`. The engine, the decoder and
// its blocks are handed one StepProfile (or none: then every scope is a null check and nothing else). Each
// scope measures wall time and the process's CPU time: with OMP_WAIT_POLICY=passive a thread waiting at a
// barrier sleeps, so CPU time / wall time is how many threads did work, and threads × wall − CPU is what
// fork/join, barriers, load imbalance and serial code cost in that op.
//
// Scopes nest: an inner scope's time is its own, and the enclosing scope keeps only the rest (the engine's
// scope around a whole step keeps what no op claimed: scheduling, bookkeeping, the logits copy).
#pragma once
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

#include "util/clock.hpp"

namespace xmoe::llm {

enum class ProfileOp : int {
  embedding,
  norms,           // RMSNorms and residual adds
  attention_proj,  // q/k/v and o projections (+ biases)
  attention,       // q/k norm, RoPE, K/V writes and the attention kernel
  router,          // router linear and expert choice
  experts,         // routed experts (and shared experts / a dense MLP)
  lm_head,
  sampler,
  engine,  // the rest of the step
  count
};
inline constexpr int kProfileOps = static_cast<int>(ProfileOp::count);
inline constexpr std::array<const char*, kProfileOps> kProfileOpNames = {
    "embedding",   "norms+residual", "attn projections", "attention",      "router",
    "experts/MLP", "lm_head",        "sampler",          "engine overhead"};

struct ProfileTotals {
  double wall = 0, cpu = 0;     // seconds
  double bytes = 0, flops = 0;  // weights / K/V read, floating-point operations
  int64_t calls = 0;
};

// What an op may cost at best: its bytes read at `read_gbs` and its flops at `peak_gflops`, whichever takes
// longer (`xmoe generate --profile --measure-bandwidth` passes the read probes' median and the register-only
// peak of the linears' arithmetic). Summed over a step's ops this bounds the step from below more tightly
// than either roofline alone: an op whose flops outlast its bytes (a wide lm_head over many rows) cannot hide
// behind the bytes of another, since each op reads its own weights.
struct ProfileLimits {
  double read_gbs = 0, peak_gflops = 0;
  std::string peak_name = "FMA";
};

class StepProfile {
 public:
  enum class Phase { prefill, decode };
  struct PhaseTotals {
    std::array<ProfileTotals, kProfileOps> ops{};
    int64_t steps = 0, tokens = 0;
    double wall = 0;
  };

  static double cpu_now() { return cpu_seconds(CLOCK_PROCESS_CPUTIME_ID); }
  static double wall_now() { return wall_seconds(); }

  // The ops recorded since the last end_step belong to a step of `phase` that fed `tokens` tokens in `wall`
  // seconds.
  void end_step(Phase phase, int64_t tokens, double wall) {
    PhaseTotals& p = phases_[static_cast<int>(phase)];
    for (int i = 0; i < kProfileOps; ++i) {
      ProfileTotals& t = p.ops[static_cast<size_t>(i)];
      const ProfileTotals& c = current_[static_cast<size_t>(i)];
      t.wall += c.wall, t.cpu += c.cpu, t.bytes += c.bytes, t.flops += c.flops, t.calls += c.calls;
    }
    current_ = {};
    ++p.steps;
    p.tokens += tokens;
    p.wall += wall;
  }
  // A step that is neither (nothing scheduled) is dropped.
  void discard_step() { current_ = {}; }

  const PhaseTotals& phase(Phase p) const { return phases_[static_cast<int>(p)]; }

  // One op's least time per step of `phase` under `limits` (seconds).
  static double op_bound(const ProfileTotals& t, int64_t steps, const ProfileLimits& limits) {
    if (steps == 0) return 0;
    const double s = static_cast<double>(steps);
    return std::max(t.bytes / s / (limits.read_gbs * 1e9), t.flops / s / (limits.peak_gflops * 1e9));
  }
  struct StepBound {
    double bound = 0, bytes_only = 0;  // seconds per step: every op at its limit; the bytes alone
  };
  StepBound bound(Phase phase, const ProfileLimits& limits) const {
    const PhaseTotals& p = this->phase(phase);
    StepBound b;
    if (p.steps == 0) return b;
    for (const ProfileTotals& t : p.ops) {
      b.bound += op_bound(t, p.steps, limits);
      b.bytes_only += t.bytes / static_cast<double>(p.steps) / (limits.read_gbs * 1e9);
    }
    return b;
  }

  // One table per phase that ran: per op its share of the step time, ms per step, GB/s and GFLOP/s over
  // its own time, and the threads busy on average (CPU / wall). `fork_join_us`: the cost of one empty
  // parallel region of `threads` threads, measured by the caller. With limits (both positive), each op's
  // least time under them too, and the step's bound against its bytes alone.
  std::string report(int threads, double fork_join_us, const ProfileLimits& limits = {}) const {
    const bool bounded = limits.read_gbs > 0 && limits.peak_gflops > 0;
    std::string out;
    char line[512];
    std::snprintf(line, sizeof line,
                  "profile: %d threads; an empty fork/join costs %.2f us; busy = CPU / wall time (with "
                  "OMP_WAIT_POLICY=passive, %d - busy threads wait at barriers or for serial code)\n",
                  threads, fork_join_us, threads);
    out += line;
    for (int ph = 0; ph < 2; ++ph) {
      const PhaseTotals& p = phases_[static_cast<size_t>(ph)];
      if (p.steps == 0) continue;
      std::snprintf(line, sizeof line, "profile %s: %lld steps, %lld tokens, %.2f ms per step\n",
                    ph == 0 ? "prefill" : "decode", static_cast<long long>(p.steps),
                    static_cast<long long>(p.tokens), 1e3 * p.wall / static_cast<double>(p.steps));
      out += line;
      std::snprintf(line, sizeof line, "  %-17s %7s %10s %9s %9s %8s %11s%s\n", "op", "share", "ms/step",
                    "GB/s", "GFLOP/s", "busy", "idle ms/st", bounded ? "   bound ms/st" : "");
      out += line;
      for (int i = 0; i < kProfileOps; ++i) {
        const ProfileTotals& t = p.ops[static_cast<size_t>(i)];
        if (t.calls == 0) continue;
        const double per_step = 1e3 * t.wall / static_cast<double>(p.steps);
        const double idle = 1e3 * (threads * t.wall - t.cpu) / static_cast<double>(p.steps);
        char gbs[16] = "-", gflops[16] = "-";
        if (t.bytes > 0 && t.wall > 0) std::snprintf(gbs, sizeof gbs, "%.1f", t.bytes / t.wall / 1e9);
        if (t.flops > 0 && t.wall > 0) std::snprintf(gflops, sizeof gflops, "%.1f", t.flops / t.wall / 1e9);
        char bound_ms[24] = "";
        if (bounded) std::snprintf(bound_ms, sizeof bound_ms, " %13.3f", 1e3 * op_bound(t, p.steps, limits));
        std::snprintf(line, sizeof line, "  %-17s %6.1f%% %10.3f %9s %9s %8.2f %11.3f%s\n",
                      kProfileOpNames[static_cast<size_t>(i)], p.wall > 0 ? 100.0 * t.wall / p.wall : 0.0,
                      per_step, gbs, gflops, t.wall > 0 ? t.cpu / t.wall : 0.0, idle, bound_ms);
        out += line;
      }
      if (bounded) {
        const StepBound b = bound(static_cast<Phase>(ph), limits);
        const double step = p.wall / static_cast<double>(p.steps);
        std::snprintf(line, sizeof line,
                      "  bound: each op at the larger of its bytes at %.2f GB/s and its flops at the %s peak "
                      "%.1f GFLOP/s: %.3f ms a step, its bytes alone %.3f ms, so at most %.1f %% of the "
                      "bandwidth roofline; the steps took %.3f ms, %.1f %% of the bound's speed\n",
                      limits.read_gbs, limits.peak_name.c_str(), limits.peak_gflops, 1e3 * b.bound,
                      1e3 * b.bytes_only, b.bound > 0 ? 100.0 * b.bytes_only / b.bound : 0.0, 1e3 * step,
                      step > 0 ? 100.0 * b.bound / step : 0.0);
        out += line;
      }
    }
    return out;
  }

 private:
  friend class ProfileScope;
  void add(ProfileOp op, double wall, double cpu, double bytes, double flops) {
    ProfileTotals& t = current_[static_cast<size_t>(op)];
    t.wall += wall, t.cpu += cpu, t.bytes += bytes, t.flops += flops;
    ++t.calls;
  }

  std::array<ProfileTotals, kProfileOps> current_{};
  std::array<PhaseTotals, 2> phases_{};
  double nested_wall_ = 0, nested_cpu_ = 0;  // time claimed by scopes so far, for enclosing scopes
};

// Times one op from construction to destruction on the calling thread (outside parallel regions); a null
// profile makes it a no-op.
class ProfileScope {
 public:
  ProfileScope(StepProfile* profile, ProfileOp op, double bytes = 0, double flops = 0)
      : profile_(profile), op_(op), bytes_(bytes), flops_(flops) {
    if (!profile_) return;
    nested_wall0_ = profile_->nested_wall_, nested_cpu0_ = profile_->nested_cpu_;
    wall0_ = StepProfile::wall_now(), cpu0_ = StepProfile::cpu_now();
  }
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;
  void set_work(double bytes, double flops) { bytes_ = bytes, flops_ = flops; }
  ~ProfileScope() {
    if (!profile_) return;
    const double wall = StepProfile::wall_now() - wall0_, cpu = StepProfile::cpu_now() - cpu0_;
    const double inner_wall = profile_->nested_wall_ - nested_wall0_;
    const double inner_cpu = profile_->nested_cpu_ - nested_cpu0_;
    profile_->add(op_, wall - inner_wall, cpu - inner_cpu, bytes_, flops_);
    profile_->nested_wall_ = nested_wall0_ + wall;
    profile_->nested_cpu_ = nested_cpu0_ + cpu;
  }

 private:
  StepProfile* profile_;
  ProfileOp op_;
  double bytes_, flops_;
  double wall0_ = 0, cpu0_ = 0, nested_wall0_ = 0, nested_cpu0_ = 0;
};

}  // namespace xmoe::llm
