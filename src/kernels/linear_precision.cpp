#include "kernels/linear_precision.hpp"

#include "xmoe/error.hpp"

namespace xmoe::kernels {

const char* matmul_precision_name(MatmulPrecision p) {
  return p == MatmulPrecision::medium ? "medium" : "highest";
}

MatmulPrecision parse_matmul_precision(const std::string& name) {
  if (name == "highest") return MatmulPrecision::highest;
  if (name == "medium") return MatmulPrecision::medium;
  throw Error(detail::concat("matmul precision: unknown value '", name, "' (expected highest or medium)"));
}

}  // namespace xmoe::kernels
