#include "xmoe/moe_layer.hpp"

#include <cmath>
#include <map>

#include "kernels/kernels.hpp"
#include "moe/experts.hpp"
#include "moe/layer_engine.hpp"
#include "xmoe/communicator.hpp"
#include "xmoe/reshard.hpp"
#include "xmoe/safetensors.hpp"

namespace xmoe {

namespace {

void validate(const MoeConfig& c) {
  const auto& g = c.gate;
  const auto& e = c.experts;
  XMOE_CHECK(c.model_dim > 0, "model_dim: must be positive, got ", c.model_dim);
  XMOE_CHECK(e.num_experts > 0, "experts.num_experts: must be positive, got ", e.num_experts);
  XMOE_CHECK(g.type == "top" || g.type == "cosine_top", "gate.type: unknown '", g.type,
             "' (expected top or cosine_top)");
  XMOE_CHECK(g.k >= 1 && g.k <= e.num_experts, "gate.k: must be in [1, num_experts=", e.num_experts,
             "], got ", g.k);
  XMOE_CHECK(std::isfinite(g.capacity_factor), "gate.capacity_factor: must be finite, got ",
             g.capacity_factor);
  XMOE_CHECK(std::isfinite(g.gate_noise) && g.gate_noise >= 0, "gate.gate_noise: must be >= 0, got ",
             g.gate_noise);
  if (g.type == "cosine_top") {
    XMOE_CHECK(g.proj_dim > 0, "gate.proj_dim: must be positive, got ", g.proj_dim);
    XMOE_CHECK(g.init_t > 0 && std::isfinite(g.init_t), "gate.init_t: must be positive, got ", g.init_t);
  }
  XMOE_CHECK(e.type == "ffn" || e.type == "swiglu" || e.type == "custom", "experts.type: unknown '", e.type,
             "' (expected ffn, swiglu or custom)");
  if (e.type != "custom")
    XMOE_CHECK(e.hidden_size > 0, "experts.hidden_size: must be positive, got ", e.hidden_size);
  if (e.type == "ffn") {
    XMOE_CHECK(e.output_dim >= 0, "experts.output_dim: must be >= 0 (0 = model_dim), got ", e.output_dim);
    moe::parse_activation(e.activation);
  }
  XMOE_CHECK(c.capacity_alignment >= 1, "capacity_alignment: must be >= 1, got ", c.capacity_alignment);
  if (!c.is_gshard_loss) {
    XMOE_CHECK(g.gate_noise > 0, "is_gshard_loss: the importance+load loss needs gate.gate_noise > 0");
    XMOE_CHECK(e.num_experts >= 2, "is_gshard_loss: the importance+load loss needs num_experts >= 2");
  }
}

const kernels::KernelTable& choose_kernels(const std::string& isa) {
  const kernels::CpuFeatures f = kernels::detect_cpu_features();
  if (isa.empty()) return kernels::best_kernel_table(f);
  return kernels::kernel_table(kernels::parse_isa(isa), f);
}

}  // namespace

struct MoeLayer::Impl {
  MoeConfig config;
  std::shared_ptr<Communicator> group;
  const kernels::KernelTable* table = nullptr;
  std::vector<std::unique_ptr<Parameter>> params;
  std::unique_ptr<moe::LayerEngineBase> engine;
  RoutingSummary routing;
  PhaseTimes times;
};

MoeLayer::MoeLayer(const MoeConfig& config, std::shared_ptr<Communicator> group)
    : impl_(std::make_unique<Impl>()) {
  validate(config);
  impl_->config = config;
  impl_->group = std::move(group);
  impl_->table = &choose_kernels(config.isa);
  impl_->engine = moe::make_layer_engine(config, *impl_->table, impl_->group.get(), impl_->params);
}

MoeLayer::~MoeLayer() = default;
MoeLayer::MoeLayer(MoeLayer&&) noexcept = default;
MoeLayer& MoeLayer::operator=(MoeLayer&&) noexcept = default;

ForwardResult MoeLayer::forward(const Tensor& x, const Switches& switches) {
  return impl_->engine->forward(x, switches, impl_->routing, impl_->times);
}

Tensor MoeLayer::backward(const Tensor& dy, double daux) {
  return impl_->engine->backward(dy, daux, impl_->times);
}

const MoeConfig& MoeLayer::config() const {
  return impl_->config;
}
int64_t MoeLayer::output_dim() const {
  return impl_->engine->output_dim();
}

std::vector<Parameter*> MoeLayer::parameters() {
  std::vector<Parameter*> out;
  for (auto& p : impl_->params) out.push_back(p.get());
  return out;
}

Parameter& MoeLayer::parameter(const std::string& name) {
  for (auto& p : impl_->params)
    if (p->name == name) return *p;
  throw Error("parameter: no parameter named '" + name + "'");
}

void MoeLayer::zero_grad() {
  for (auto& p : impl_->params) p->grad.zero();
}

void MoeLayer::save(const std::string& path) const {
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (auto& p : impl_->params) tensors.emplace_back(p->name, p->value);
  const int rank = impl_->group ? impl_->group->rank() : 0, size = impl_->group ? impl_->group->size() : 1;
  std::map<std::string, std::string> metadata = {
      {kMetaNumGlobalExperts, std::to_string(impl_->config.experts.num_experts)},
      {kMetaRank, std::to_string(rank)},
      {kMetaWorldSize, std::to_string(size)},
      {"format", "xmoe.moe_layer"}};
  // Which dim a hidden-sharded checkpoint splits (down_proj splits its last dim, not Tutel's first non-1).
  if (impl_->config.experts.type != "custom")
    for (auto& p : impl_->params)
      if (p->is_expert)
        metadata[kMetaExpertSplitDimPrefix + p->name] = std::to_string(moe::expert_split_dim(p->name));
  save_safetensors(path, tensors, metadata);
}

void MoeLayer::load(const std::string& path) {
  SafetensorsFile file = SafetensorsFile::open(path);
  const auto& meta = file.metadata();
  if (auto it = meta.find("_num_global_experts"); it != meta.end())
    XMOE_CHECK(it->second == std::to_string(impl_->config.experts.num_experts), path,
               ": _num_global_experts is ", it->second, ", the layer has ",
               impl_->config.experts.num_experts);
  // Read everything first so a bad file leaves the layer unchanged.
  std::vector<Tensor> staged;
  for (auto& p : impl_->params) {
    XMOE_CHECK(file.contains(p->name), path, ": missing tensor '", p->name, "'");
    const SafetensorsEntry& e = file.entry(p->name);
    Tensor t = file.tensor(p->name);
    XMOE_CHECK(t.shape() == p->value.shape(), path, ": tensor '", p->name, "' has shape ", t.shape().str(),
               ", expected ", p->value.shape().str());
    XMOE_CHECK(t.dtype() == p->value.dtype(), path, ": tensor '", p->name, "' has dtype ", e.dtype,
               ", expected ", dtype_name(p->value.dtype()));
    staged.push_back(t);
  }
  for (const SafetensorsEntry& e : file.entries()) {
    bool known = false;
    for (auto& p : impl_->params) known = known || p->name == e.name;
    XMOE_CHECK(known, path, ": unexpected tensor '", e.name, "' (not a parameter of this layer)");
  }
  for (size_t i = 0; i < staged.size(); ++i) impl_->params[i]->value.copy_from(staged[i]);
}

const RoutingSummary& MoeLayer::last_routing() const {
  return impl_->routing;
}
const PhaseTimes& MoeLayer::last_times() const {
  return impl_->times;
}
size_t MoeLayer::workspace_bytes() const {
  return impl_->engine->workspace_bytes();
}
const char* MoeLayer::kernel_isa() const {
  return kernels::isa_name(impl_->table->isa);
}

}  // namespace xmoe
