// The MoE layer (Tutel semantics) on CPU: gate → routing → dispatch → experts → combine, forward and
// backward.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "xmoe/tensor.hpp"

namespace xmoe {

class Communicator;

struct Parameter {
  std::string name;
  Tensor value;            // layer dtype
  Tensor grad;             // f32 for f32/bf16 layers, f64 for f64 layers; accumulated by backward
  bool is_expert = false;  // expert parameters are not all-reduced across the expert-parallel group
};

// A user expert: a C++ callable with forward and backward over rows grouped by expert.
class CustomExpert {
 public:
  virtual ~CustomExpert() = default;
  virtual int64_t output_dim(int64_t model_dim) const { return model_dim; }
  // x: [rows, model_dim] in the layer's dtype; rows [offsets[e], offsets[e+1]) belong to local expert e.
  // Writes y: [rows, output_dim], same dtype.
  virtual void forward(const Tensor& x, std::span<const int64_t> offsets, Tensor& y) = 0;
  // Given dy of the last forward, writes dx and accumulates the gradients of its own parameters.
  virtual void backward(const Tensor& dy, std::span<const int64_t> offsets, Tensor& dx) = 0;
  virtual std::vector<Parameter*> parameters() { return {}; }
};

struct GateConfig {
  std::string type = "top";  // "top" | "cosine_top"
  int k = 2;
  double capacity_factor = 1.0;  // > 0 padded, 0 dropless, < 0 capped dropless
  double gate_noise = 0.0;       // training only
  bool fp32_gate = true;
  int64_t proj_dim = 256;  // cosine_top
  double init_t = 0.5;     // cosine_top: τ starts at ln(1/init_t)
};

struct ExpertConfig {
  std::string type = "ffn";  // "ffn" | "swiglu" | "custom"
  int num_experts = 2;       // global expert count E
  int64_t hidden_size = 0;
  int64_t output_dim = 0;           // ffn only; 0 = model_dim
  std::string activation = "relu";  // ffn: relu | gelu | silu
  bool has_fc1_bias = true;
  bool has_fc2_bias = true;
  std::shared_ptr<CustomExpert> custom;  // type == "custom"
};

struct MoeConfig {
  GateConfig gate;
  ExpertConfig experts;
  int64_t model_dim = 0;
  DType dtype = DType::f32;
  bool is_postscore = true;
  bool batch_prioritized_routing = false;
  bool normalize_gate = true;  // k > 1 only
  bool is_gshard_loss = true;  // false: importance + load loss (needs gate_noise > 0)
  int64_t capacity_alignment = 1;
  uint64_t seed_gate = 1;  // Tutel's seeds (s_gate, s_local)
  uint64_t seed_experts = 1;
  int adaptive_r = 1;  // expert-parallel default: 1 = expert parallel, 0 = data parallel (gather experts)
  int a2a_overlap_degree = 1;
  bool use_2dh = false;  // expert parallel: hierarchical (intra-node, then inter-node) all-to-all
  int local_size = 0;    // ranks per node for use_2dh; 0 = the LOCAL_SIZE environment variable  //
                         // expert-parallel default: capacity chunks whose all-to-all overlaps compute
  std::string isa;       // kernel level cap ("reference", "avx2", "avx512", ...); empty = best this CPU runs
};

enum class ExpertExecution {
  padded,   // Tutel: [E, C, M] buffer, every expert runs C rows
  grouped,  // MegaBlocks-like: token copies sorted by expert, each expert runs exactly its kept rows
};

// Per-call switches. None re-lays out parameters; buffers grow only when a call needs more than any before.
struct Switches {
  int top_k = 0;                          // 0: the gate's k
  std::optional<double> capacity_factor;  // unset: the gate's
  ExpertExecution execution = ExpertExecution::padded;
  bool training = true;           // gate noise applies only in training
  const Tensor* noise = nullptr;  // [T, E] N(0,1) draws to use for gate noise instead of the layer's own
  std::optional<int> adaptive_r;  // unset: the config's (the same value on every rank of the group)
  int a2a_overlap_degree = 0;     // 0: the config's (the same value on every rank of the group)
};

struct ForwardResult {
  Tensor y;               // x's leading dims + [output_dim], layer dtype
  double aux_loss = 0.0;  // GShard or importance+load loss
};

struct RoutingSummary {
  int64_t tokens = 0;
  int top_k = 0;
  int64_t capacity = 0;
  std::vector<int32_t> expert_counts;  // per expert, before capacity drops (counts every choice)
  std::vector<int32_t> expert_ids;     // [top_k, tokens], choice-major as in Tutel
  std::vector<int32_t> locations;      // [top_k, tokens]
  int64_t dropped = 0;                 // token copies past capacity
};

struct PhaseTimes {  // seconds of the last forward / backward
  double gate = 0, routing = 0, encode = 0, experts = 0, decode = 0;
  double backward = 0, backward_experts = 0;
  double communication =
      0;  // all-to-all and parameter gathers of the last forward + backward (expert parallel)
};

class MoeLayer {
 public:
  // validates; throws xmoe::Error naming the field. With a group of W > 1 ranks the layer is expert parallel:
  // E = experts.num_experts global experts, E / W of them held (and initialised as in the single-process
  // layer) by each rank; every rank calls forward/backward collectively with its own tokens.
  explicit MoeLayer(const MoeConfig& config, std::shared_ptr<Communicator> group = nullptr);
  ~MoeLayer();
  MoeLayer(MoeLayer&&) noexcept;
  MoeLayer& operator=(MoeLayer&&) noexcept;

  ForwardResult forward(const Tensor& x, const Switches& switches = {});
  // Backward of the last forward: returns dx and accumulates parameter gradients; daux scales the aux loss.
  Tensor backward(const Tensor& dy, double daux = 0.0);

  const MoeConfig& config() const;
  int64_t output_dim() const;
  std::vector<Parameter*> parameters();  // gate parameters, then expert parameters
  Parameter& parameter(const std::string& name);
  void zero_grad();

  // Parameters as safetensors, with metadata `_num_global_experts`. load() checks names, dtypes and shapes
  // and throws naming the file and tensor; on error the layer keeps its previous values.
  void save(const std::string& path) const;
  void load(const std::string& path);

  const RoutingSummary& last_routing() const;
  const PhaseTimes& last_times() const;
  size_t workspace_bytes() const;  // bytes held in reusable buffers
  const char* kernel_isa() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace xmoe
