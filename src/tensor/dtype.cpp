#include "xmoe/dtype.hpp"

#include <string>

#include "xmoe/error.hpp"

namespace xmoe {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32:
      return 4;
    case DType::f64:
      return 8;
    case DType::bf16:
      return 2;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32:
      return "float32";
    case DType::f64:
      return "float64";
    case DType::bf16:
      return "bfloat16";
  }
  return "?";
}

DType parse_dtype(std::string_view name) {
  if (name == "float32" || name == "f32" || name == "F32" || name == "float") return DType::f32;
  if (name == "float64" || name == "f64" || name == "F64" || name == "double") return DType::f64;
  if (name == "bfloat16" || name == "bf16" || name == "BF16") return DType::bf16;
  throw Error(
      detail::concat("dtype: unknown '", std::string(name), "' (expected float32, float64 or bfloat16)"));
}

}  // namespace xmoe
