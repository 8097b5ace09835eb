#include "llm/arch/tensor_plan.hpp"

#include "xmoe/error.hpp"

namespace xmoe::llm {

int64_t PlannedTensor::numel() const {
  // Each config size is in range on its own, but their products can overflow: name the tensor instead.
  int64_t n = 1;
  for (int64_t d : shape)
    XMOE_CHECK(!__builtin_mul_overflow(n, d, &n), "init-model: tensor '", name, "' would be too large");
  return n;
}

PlannedTensor random_tensor(std::string name, std::vector<int64_t> shape, TensorRole role) {
  PlannedTensor t{std::move(name), std::move(shape), TensorInit::normal, {}, role, ""};
  t.segments.push_back({t.name, t.numel()});
  return t;
}

PlannedTensor constant_tensor(std::string name, std::vector<int64_t> shape, TensorInit init) {
  return PlannedTensor{std::move(name), std::move(shape), init, {}, TensorRole::other, ""};
}

std::string module_of(const std::string& weight_name) {
  const std::string suffix = ".weight";
  if (weight_name.size() > suffix.size() &&
      weight_name.compare(weight_name.size() - suffix.size(), suffix.size(), suffix) == 0)
    return weight_name.substr(0, weight_name.size() - suffix.size());
  return weight_name;
}

const PlannedTensor* find_planned(const std::vector<PlannedTensor>& plan, const std::string& name) {
  for (const PlannedTensor& t : plan)
    if (t.name == name) return &t;
  return nullptr;
}

std::vector<std::string> kept_linear_modules(const std::vector<PlannedTensor>& plan) {
  std::vector<std::string> modules;
  for (const PlannedTensor& t : plan)
    if (t.role == TensorRole::kept_linear) modules.push_back(module_of(t.name));
  return modules;
}

}  // namespace xmoe::llm
