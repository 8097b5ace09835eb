// `xmoe bench`: Tutel's helloworld on the CPU MoE layer, with a per-phase breakdown.
#pragma once
#include <cstdint>
#include <string>

namespace xmoe::app {

struct BenchOptions {
  int64_t batch_size = 16;
  int64_t num_tokens = 512;
  int64_t model_dim = 2048;
  int64_t hidden_size = 2048;
  int num_local_experts = 2;
  int top = 2;
  double capacity_factor = 1.0;
  std::string dtype = "float32";
  bool eval = false;
  int num_steps = 5;
  bool dropless = false;  // capacity_factor 0 and grouped (no padded rows) execution
  std::string expert_type = "ffn";
  std::string activation = "relu";
  std::string gate_type = "top";
  double gate_noise = 0.0;
  double l_aux_wt = 0.0;
  double lr = 1e-4;
  std::string optimizer = "sgd";  // sgd | adam (torch.optim.Adam's defaults but lr)
  int threads = 0;                // 0 = OpenMP's default
  std::string isa;                // empty = best this CPU runs
  bool measure_switching = false;
  uint64_t seed = 0;
  // Expert parallelism (under mpirun): E = num_local_experts · ranks, or ranks / |num_local_experts| when
  // negative (experts sharded over |num_local_experts| ranks).
  std::string parallel_type = "adaptive:1";  // adaptive:R | data | model (Tutel's; R ∈ {0} ∪ divisors(sc))
  int adaptive_r = -1;                       // overrides parallel_type when >= 0
  int a2a_overlap_degree = 1;
  bool use_2dh = false;
  int local_size = 0;
};

int run_bench(const BenchOptions& options);  // returns the process exit code

}  // namespace xmoe::app
