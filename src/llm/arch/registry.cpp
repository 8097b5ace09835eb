#include "llm/arch/architecture.hpp"

namespace xmoe::llm {

#define XMOE_ARCHITECTURE(id) const Architecture& id##_architecture();
#include "llm/arch/architectures.def"
#undef XMOE_ARCHITECTURE

const std::vector<const Architecture*>& architectures() {
  static const std::vector<const Architecture*> all = {
#define XMOE_ARCHITECTURE(id) &id##_architecture(),
#include "llm/arch/architectures.def"
#undef XMOE_ARCHITECTURE
  };
  return all;
}

const Architecture* find_architecture(std::string_view name) {
  for (const Architecture* a : architectures())
    if (a->name() == name) return a;
  return nullptr;
}

const Architecture* find_architecture_by_model_type(std::string_view model_type) {
  for (const Architecture* a : architectures())
    if (a->has_model_type(model_type)) return a;
  return nullptr;
}

const Architecture& architecture_of(const ModelConfig& config) {
  const Architecture* a = find_architecture(config.architecture);
  XMOE_CHECK(a != nullptr, "architectures: '", config.architecture,
             "' is not supported (supported: ", supported_architecture_names(), ")");
  return *a;
}

std::string supported_architecture_names() {
  std::string s;
  for (const Architecture* a : architectures()) {
    if (!s.empty()) s += ", ";
    s += a->name();
  }
  return s;
}

}  // namespace xmoe::llm
