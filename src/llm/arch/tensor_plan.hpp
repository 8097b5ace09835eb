// The tensors of a checkpoint as an architecture names and shapes them, in module order: what `xmoe
// init-model` writes (with how each is initialised) and what `init-model --quant` / `xmoe quantize` may
// quantize. The architecture's loader reads the same names (both come from the architecture's name map).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace xmoe::llm {

enum class ExpertLayout {
  per_expert,  // one tensor per expert and projection (what most checkpoints on the Hub hold)
  fused,       // the experts of a layer stacked in 3-D tensors (transformers v5's layout)
};

enum class TensorInit { normal, ones, zeros };

// What a tensor is to the quantized writers.
enum class TensorRole {
  quantized_linear,  // a 2-D nn.Linear weight the published quantized checkpoints quantize
  kept_linear,  // a 2-D nn.Linear weight they keep unquantized (router, lm_head): listed as not converted
  other,        // embeddings, norms, biases, sinks, fused 3-D expert tensors
  // gpt-oss's fused experts [E, in, out] in transformers' x @ W layout, which its published MXFP4 checkpoint
  // stores transposed as <name>_blocks U8 [E, out, in/32, 16] + <name>_scales U8 [E, out, in/32]
  mxfp4_experts,
};

// A run of a tensor's elements taken from the first `count` values of another (logical) tensor's random
// stream: a fused expert tensor is the concatenation of its per-expert tensors, so both layouts of one seed
// hold the same model.
struct StreamSegment {
  std::string source;
  int64_t count = 0;
};

struct PlannedTensor {
  std::string name;
  std::vector<int64_t> shape;
  TensorInit init = TensorInit::normal;
  std::vector<StreamSegment> segments;  // init == normal: covering all numel() elements in order
  TensorRole role = TensorRole::other;
  // NVFP4: the linear that shares this one's weight_scale_2 (a gate_proj and its up_proj run fused), or "".
  std::string scale_partner;
  int64_t numel() const;  // throws naming the tensor when the product overflows
};

// A tensor drawn from its own random stream (the init-model default for weights).
PlannedTensor random_tensor(std::string name, std::vector<int64_t> shape,
                            TensorRole role = TensorRole::other);
// A tensor of ones (norm weights) or zeros (biases, as transformers initialises nn.Linear biases).
PlannedTensor constant_tensor(std::string name, std::vector<int64_t> shape, TensorInit init);
// The module of a "<module>.weight" name.
std::string module_of(const std::string& weight_name);

// The planned tensor named `name`, or nullptr.
const PlannedTensor* find_planned(const std::vector<PlannedTensor>& plan, const std::string& name);
// Modules the quantized writers leave unquantized (kept_linear tensors), for quantization_config.
std::vector<std::string> kept_linear_modules(const std::vector<PlannedTensor>& plan);

}  // namespace xmoe::llm
