// --matmul-precision for the commands that run a model (generate, serve): the option, and the precision a
// run gets on this CPU (medium needs bf16 products; elsewhere it falls back to highest with a notice).
#pragma once
#include <CLI/CLI.hpp>
#include <string>

#include "kernels/linear_precision.hpp"
#include "xmoe/dtype.hpp"

namespace xmoe::app {

CLI::Option* add_matmul_precision_option(CLI::App* cmd, std::string& value);

// The precision the kernel level `isa_cap` (empty: the best this CPU runs) gives for `requested`: medium
// needs a CPU with AVX512-BF16 and a level that uses it (avx512_bf16, amx; reference emulates it exactly);
// else it falls back to highest with a one-line notice on stderr. So does `dtype` f32, which widens BF16
// weights to f32 at load (medium concerns BF16 weights only).
kernels::MatmulPrecision effective_matmul_precision(const std::string& requested, const std::string& isa_cap,
                                                    DType dtype);

}  // namespace xmoe::app
