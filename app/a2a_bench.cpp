#include "a2a_bench.hpp"
#include "cli_checks.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "stats.hpp"
#include "xmoe/communicator.hpp"
#include "xmoe/error.hpp"
#ifdef XMOE_HAVE_MPI
#include <mpi.h>

#include "xmoe/mpi.hpp"
#endif

namespace xmoe::app {

namespace {

using Clock = std::chrono::steady_clock;

// One row of the table: our call and, when MPI is there, the raw blocking MPI call it is compared with.
struct Case {
  std::string name;
  std::function<void()> ours;
  std::function<void()> raw;  // empty without MPI
};

struct Timing {
  double ours_s = 0, raw_s = 0;
};

// Runs ours and raw alternately (the order flips every iteration so neither always runs on a warm cache),
// each after a barrier so that every rank starts together. A call's time is the slowest rank's time; the
// result is the median over the timed iterations.
Timing time_case(Communicator& world, const Case& c, int warmup, int loop) {
  std::vector<double> t[2];
  for (int it = 0; it < warmup + loop; ++it) {
    for (int k = 0; k < 2; ++k) {
      const int which = it % 2 ? 1 - k : k;
      const std::function<void()>& fn = which == 0 ? c.ours : c.raw;
      if (!fn) continue;
      world.barrier();
      const Clock::time_point t0 = Clock::now();
      fn();
      const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
      if (it >= warmup) t[which].push_back(dt);
    }
  }
  Timing r;
  for (int w = 0; w < 2; ++w) {
    if (t[w].empty()) continue;
    std::vector<double> slowest(t[w].size());
    world.all_reduce(t[w].data(), slowest.data(), t[w].size(), ElementType::f64, ReduceOp::max);
    (w == 0 ? r.ours_s : r.raw_s) = median(slowest);
  }
  return r;
}

}  // namespace

CLI::App* add_a2a_bench_subcommand(CLI::App& app, A2aBenchOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "a2a-bench",
      "Tutel bandwidth_test: GB/s of all_to_all, all_reduce, all_gather, reduce_scatter through xmoe's "
      "communicator vs the raw MPI call (run under mpirun)");
  cmd->add_option("--size_mb", o.size_mb, "send buffer size in MiB")
      ->check(positive_integer())
      ->capture_default_str();
  cmd->add_option("--sizes", o.sizes, "comma-separated send buffer sizes in MiB (replaces --size_mb)")
      ->delimiter(',')
      ->check(positive_integer());
  cmd->add_option("--loop", o.loop, "timed iterations per collective")
      ->check(positive_integer())
      ->capture_default_str();
  cmd->add_option("--warmup", o.warmup, "untimed iterations first")
      ->check(non_negative_integer())
      ->capture_default_str();
  cmd->add_flag("--use_2dh", o.use_2dh, "also time the hierarchical (2DH) all-to-all");
  cmd->add_option("--local_size", o.local_size, "ranks per node for --use_2dh (default: LOCAL_SIZE env)")
      ->check(positive_integer());
  return cmd;
}

int run_a2a_bench(const A2aBenchOptions& o) {
  std::vector<int64_t> sizes = o.sizes.empty() ? std::vector<int64_t>{o.size_mb} : o.sizes;
  for (int64_t s : sizes)
    XMOE_CHECK(s > 0 && s <= (int64_t{1} << 20), "--sizes: each size must be in [1, 1048576] MiB, got ", s);
#ifdef XMOE_HAVE_MPI
  MpiSession session;
  std::unique_ptr<Communicator> world = session.world();
  const bool have_raw = true;
#else
  std::unique_ptr<Communicator> world = make_local_communicator();
  const bool have_raw = false;
#endif
  const int w = world->size();
  const bool root = world->rank() == 0;
  std::unique_ptr<HierarchicalAllToAll> h2d;
  if (o.use_2dh) h2d = std::make_unique<HierarchicalAllToAll>(*world, o.local_size);

  if (root) {
    std::printf(
        "[a2a-bench] world_size = %d, dtype = float32, loop = %d, warmup = %d, backend = %s, 2dh = %s; GB/s "
        "= "
        "send buffer bytes / median time (the slowest rank's, per call)\n",
        w, o.loop, o.warmup, have_raw ? "mpi" : "local (built without MPI)",
        h2d ? detail::concat("local_size ", h2d->local_size(), ", nodes ", h2d->num_nodes(),
                             h2d->is_flat() ? " (flat)" : "")
                  .c_str()
            : "off");
    std::printf("%8s  %-15s %10s %10s %9s %10s %10s\n", "size_MiB", "collective", "ours_GB/s", "raw_GB/s",
                "ours/raw", "ours_ms", "raw_ms");
    std::fflush(stdout);
  }
  for (int64_t size_mb : sizes) {
    // Tutel: size_mb MiB of float32, rounded up to a multiple of the world size.
    const size_t n = ((static_cast<size_t>(size_mb) << 20) / 4 + static_cast<size_t>(w) - 1) /
                     static_cast<size_t>(w) * static_cast<size_t>(w);
    const size_t per = n / static_cast<size_t>(w);
    const double bytes = static_cast<double>(n) * 4.0;
    std::vector<float> send(n), recv(n * static_cast<size_t>(w));  // all_gather receives w times the send
    for (size_t i = 0; i < n; ++i) send[i] = static_cast<float>(i % 1000) * 0.5f;
    std::fill(recv.begin(), recv.end(), 0.f);  // fault the pages in before timing
    float* s = send.data();
    float* r = recv.data();
    std::vector<Case> cases;
    cases.push_back({"all_to_all", [&] { world->all_to_all(s, r, per, ElementType::f32); }, {}});
    if (h2d) cases.push_back({"all_to_all_2dh", [&] { h2d->run(s, r, per, ElementType::f32); }, {}});
    cases.push_back({"all_reduce", [&] { world->all_reduce(s, r, n, ElementType::f32, ReduceOp::sum); }, {}});
    cases.push_back({"all_gather", [&] { world->all_gather(s, r, n, ElementType::f32); }, {}});
    cases.push_back(
        {"reduce_scatter", [&] { world->reduce_scatter(s, r, per, ElementType::f32, ReduceOp::sum); }, {}});
#ifdef XMOE_HAVE_MPI
    XMOE_CHECK(n * static_cast<size_t>(w) <= static_cast<size_t>(INT32_MAX), "--sizes: ", size_mb,
               " MiB is too large for one MPI call at world size ", w);
    const int in = static_cast<int>(n), ip = static_cast<int>(per);
    cases[0].raw = [=] { MPI_Alltoall(s, ip, MPI_FLOAT, r, ip, MPI_FLOAT, MPI_COMM_WORLD); };
    size_t k = h2d ? 2 : 1;
    if (h2d) cases[1].raw = cases[0].raw;
    cases[k++].raw = [=] { MPI_Allreduce(s, r, in, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); };
    cases[k++].raw = [=] { MPI_Allgather(s, in, MPI_FLOAT, r, in, MPI_FLOAT, MPI_COMM_WORLD); };
    cases[k++].raw = [=] { MPI_Reduce_scatter_block(s, r, ip, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); };
#endif
    for (const Case& c : cases) {
      const Timing t = time_case(*world, c, o.warmup, o.loop);
      if (!root) continue;
      if (have_raw)
        std::printf("%8lld  %-15s %10.3f %10.3f %9.3f %10.3f %10.3f\n", static_cast<long long>(size_mb),
                    c.name.c_str(), bytes / t.ours_s / 1e9, bytes / t.raw_s / 1e9, t.raw_s / t.ours_s,
                    t.ours_s * 1e3, t.raw_s * 1e3);
      else
        std::printf("%8lld  %-15s %10.3f %10s %9s %10.3f %10s\n", static_cast<long long>(size_mb),
                    c.name.c_str(), bytes / t.ours_s / 1e9, "-", "-", t.ours_s * 1e3, "-");
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace xmoe::app
