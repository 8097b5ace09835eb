#include "matmul_precision_option.hpp"

#include <cstdio>

#include "kernels/kernels.hpp"

namespace xmoe::app {

CLI::Option* add_matmul_precision_option(CLI::App* cmd, std::string& value) {
  return cmd
      ->add_option("--matmul-precision", value,
                   "linears over BF16, FP8, MXFP4 and NVFP4 weights: highest (f32 arithmetic) | medium "
                   "(activations rounded to bf16, "
                   "bf16 products, f32 accumulation; needs AVX512-BF16)")
      ->check(CLI::IsMember({"highest", "medium"}))
      ->capture_default_str();
}

kernels::MatmulPrecision effective_matmul_precision(const std::string& requested, const std::string& isa_cap,
                                                    DType dtype) {
  const kernels::MatmulPrecision want = kernels::parse_matmul_precision(requested);
  if (want == kernels::MatmulPrecision::medium && dtype == DType::f32) {
    std::fprintf(stderr,
                 "notice: --matmul-precision medium concerns BF16 weights; --dtype f32 widens them to "
                 "f32 at load: running highest\n");
    return kernels::MatmulPrecision::highest;
  }
  const kernels::CpuFeatures features = kernels::detect_cpu_features();
  const kernels::Isa isa = isa_cap.empty() ? kernels::best_isa(features) : kernels::parse_isa(isa_cap);
  // The CPU must have the instruction: the reference level's emulation of it is for tests, not for runs.
  const kernels::MatmulPrecision got = kernels::isa_supported(features, kernels::Isa::avx512_bf16)
                                           ? kernels::kernel_table(isa, features, want).precision
                                           : kernels::MatmulPrecision::highest;
  if (got != want)
    std::fprintf(stderr, "notice: --matmul-precision %s needs AVX512-BF16 (kernel level %s): running %s\n",
                 kernels::matmul_precision_name(want), kernels::isa_name(isa),
                 kernels::matmul_precision_name(got));
  return got;
}

}  // namespace xmoe::app
