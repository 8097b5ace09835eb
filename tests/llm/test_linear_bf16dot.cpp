// The `medium` matmul precision's BF16 linear (kernels/cpu/linear_bf16dot.hpp):
//  * the AVX512-BF16 kernel gives the scalar reference's bits for m = 1..17, 64, 100 and awkward k / n, on
//    data that exposes VDPBF16PS's operand order, denormal handling and rounding (so the reference's model of
//    the instruction is checked against the instruction itself);
//  * the reference lies within f32 accumulation error of PyTorch's float64 product of the bf16-rounded
//    operands (tools/make_bf16dot_fixture.py writes the fixture);
//  * decode with and without its software prefetches (the AMD table's form) gives the same bits;
//  * a row's outputs do not depend on the rest of the batch or the thread count;
//  * a tiny Qwen3-MoE with BF16 weights run at medium stays within bf16-level tolerance of transformers' f32
//    logits with the same greedy ids;
//  * levels without bf16 products fall back to highest, and bad names are refused.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "bf16_linear_cases.hpp"
#include "cli_runner.hpp"
#include "kernels/cpu/variants.hpp"
#include "kernels/cpu_features.hpp"
#include "kernels/kernels.hpp"
#include "kernels/linear.hpp"
#include "llm/model.hpp"
#include "model_oracle.hpp"
#include "xmoe/error.hpp"
#include "xmoe/safetensors.hpp"

namespace xmoe::kernels {
namespace {

using namespace test;

const KernelTable* fast_medium_table() {
  const CpuFeatures features = detect_cpu_features();
  if (!isa_supported(features, Isa::avx512_bf16)) return nullptr;
  return &kernel_table(Isa::avx512_bf16, features, MatmulPrecision::medium);
}
const KernelTable& reference_medium_table() {
  return kernel_table(Isa::reference, detect_cpu_features(), MatmulPrecision::medium);
}

TEST(LinearBf16Dot, KernelMatchesReferenceBitForBit) {
  const KernelTable* fast = fast_medium_table();
  if (!fast) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  const KernelTable& ref = reference_medium_table();
  ASSERT_EQ(fast->precision, MatmulPrecision::medium);
  std::mt19937 rng(11);
  int64_t cases = 0;
  for (int64_t m : {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 64, 100})
    for (int64_t k : {1, 2, 31, 33, 64, 67, 130, 1100})
      for (int64_t n : {1, 5, 6, 7, 13}) {  // 5: groups of 3 columns (5 to 8 rows) and a tail
        if (m > 17 && k != 67) continue;    // the large m cross the row chunk; one k is enough there
        if (k == 1100 && (m < 9 || m > 16)) continue;  // 9 to 16 rows tile by k (4 x 6 past ~1024)
        const int64_t n0 = n > 6 ? 1 : 0;              // a column range not starting at 0
        ASSERT_NO_FATAL_FAILURE(expect_same_bits_on_random_case(fast->linear[size_t(WeightFormat::bf16)],
                                                                ref.linear[size_t(WeightFormat::bf16)], m, k,
                                                                n, n0, rng));
        ++cases;
      }
  EXPECT_GT(cases, 300);
}

// Decode (1 to 3 x rows) with its software prefetches and without them at one x row (the table's choice on
// AMD): the reference's bits either way, over enough rows of k = 2048 that the prefetches run ahead; the
// medium table holds the form for the CPU's vendor.
TEST(LinearBf16Dot, DecodeWithOrWithoutSoftwarePrefetchesKeepsTheBits) {
  const KernelTable* fast = fast_medium_table();
  if (!fast) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  const LinearFn ref = reference_medium_table().linear[size_t(WeightFormat::bf16)];
  std::mt19937 rng(13);
  for (LinearFn fn : {avx512_bf16::linear_bf16_medium, avx512_bf16::linear_bf16_medium_hardware_prefetch})
    for (int64_t m : {1, 2, 3})
      for (int64_t k : {33, 2048, 2100})
        ASSERT_NO_FATAL_FAILURE(expect_same_bits_on_random_case(fn, ref, m, k, 40, 1, rng));
  CpuFeatures features = detect_cpu_features();
  for (bool amd : {false, true}) {
    features.amd = amd;
    EXPECT_EQ(
        kernel_table(Isa::avx512_bf16, features, MatmulPrecision::medium).linear[size_t(WeightFormat::bf16)],
        amd ? avx512_bf16::linear_bf16_medium_hardware_prefetch : avx512_bf16::linear_bf16_medium);
  }
}

// Hand-made lanes whose result depends on each documented detail of VDPBF16PS; the kernel (the instruction)
// and the reference must give the stated values.
TEST(LinearBf16Dot, InstructionSemanticsAreTheReferences) {
  struct Case {
    const char* what;
    // k = 64: lane 0 sees pair (0, 1) in step 0 and pair (32, 33) in step 1; everything else is zero.
    float x0, w0, x1, w1, x32, w32, x33, w33;
    float expected;
  };
  const float big = 0x1p24f;
  const Case cases[] = {
      // Step 1 adds the odd product first: (1 + 2^24) rounds to 2^24, minus 2^24 is 0. Even first gives 1.
      {"odd product first", 1, 1, 0, 0, -1, big, 1, big, 0.0f},
      // A bf16 denormal operand counts as zero: 2^-130 · 2^100 would be 2^-30.
      {"denormal operand is zero", 0x1p-130f, 0x1p100f, 0, 0, 0, 0, 0, 0, 0.0f},
      // 1.5·2^-126 − 2^-126 = 2^-127 is denormal: flushed to zero.
      {"denormal sum is flushed", 1.5f * 0x1p-126f, 1, -0x1p-126f, 1, 0, 0, 0, 0, 0.0f},
      // Products are exact: 3·(1 + 2^-7)... (1 + 2^-7)² = 1 + 2^-6 + 2^-14 rounds only when added.
      {"exact product", 1 + 0x1p-7f, 1 + 0x1p-7f, 0, 0, 0, 0, 0, 0, 1 + 0x1p-6f + 0x1p-14f},
  };
  const KernelTable* fast = fast_medium_table();
  for (const Case& c : cases) {
    std::vector<float> x(64, 0.0f);
    std::vector<uint16_t> v(64, 0);
    x[0] = c.x0, x[1] = c.x1, x[32] = c.x32, x[33] = c.x33;
    v[0] = bits_of(c.w0), v[1] = bits_of(c.w1), v[32] = bits_of(c.w32), v[33] = bits_of(c.w33);
    const Bf16Weight tw(v, 1, 64, 64);
    EXPECT_EQ(run(reference_medium_table(), tw.w, x, 1, 64, 0, 1)[0], c.expected) << c.what << " (reference)";
    if (fast) {
      EXPECT_EQ(run(*fast, tw.w, x, 1, 64, 0, 1)[0], c.expected) << c.what << " (AVX512-BF16)";
    }
  }
}

// PyTorch's float64 product of the bf16-rounded operands; each output lies within the f32 error bound of its
// summation: (2·steps + 4) additions on a path (a lane's pair sums, then the 4-level tree), each off by at
// most 2^-24 of the partial sum, itself at most Σ|x̂ ŵ|.
TEST(LinearBf16Dot, ReferenceIsWithinF32ErrorOfPyTorch) {
  std::vector<std::pair<std::string, LinearFn>> kernels{
      {"reference", reference_medium_table().linear[size_t(WeightFormat::bf16)]}};
  if (const KernelTable* fast = fast_medium_table())
    kernels.push_back({"avx512_bf16", fast->linear[size_t(WeightFormat::bf16)]});
  expect_within_f32_bound_of_pytorch(kernels, 2, 4);
}

TEST(LinearBf16Dot, RowsDoNotDependOnTheBatchOrThreads) {
  const KernelTable* fast = fast_medium_table();
  if (!fast) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  expect_rows_independent_of_batch_and_threads(*fast);
}

TEST(LinearBf16Dot, TablesAndNames) {
  const CpuFeatures features = detect_cpu_features();
  EXPECT_EQ(parse_matmul_precision("medium"), MatmulPrecision::medium);
  EXPECT_EQ(parse_matmul_precision("highest"), MatmulPrecision::highest);
  EXPECT_THROW(parse_matmul_precision("high"), Error);
  EXPECT_EQ(kernel_table(Isa::reference, features, MatmulPrecision::highest).precision,
            MatmulPrecision::highest);
  EXPECT_EQ(&kernel_table(Isa::reference, features, MatmulPrecision::highest), &reference_kernel_table());
  for (Isa isa : {Isa::avx2, Isa::avx512}) {
    if (!isa_supported(features, isa)) continue;
    const KernelTable& t = kernel_table(isa, features, MatmulPrecision::medium);
    EXPECT_EQ(t.precision, MatmulPrecision::highest) << isa_name(isa);
    EXPECT_EQ(&t, &kernel_table(isa, features)) << isa_name(isa);
  }
  // Only the BF16 linear changes.
  const KernelTable& med = reference_medium_table();
  EXPECT_NE(med.linear[size_t(WeightFormat::bf16)],
            reference_kernel_table().linear[size_t(WeightFormat::bf16)]);
  EXPECT_EQ(med.linear[size_t(WeightFormat::f32)],
            reference_kernel_table().linear[size_t(WeightFormat::f32)]);
}

}  // namespace
}  // namespace xmoe::kernels

namespace xmoe::llm::test {
namespace {

// transformers computes in f32 over the bf16 weights; medium rounds every linear's input to bf16 (8
// significant bits), a few bf16 roundings per layer: 3e-2 of the row's largest logit, as the bf16 path's
// test allows. The model loads with dtype bf16 (weights read in place; f32 would widen them at load and leave
// no BF16 linear to run at medium).
void tiny_model_at_medium_matches_transformers(const std::string& isa) {
  Loaded medium{Checkpoint::open(kModels + "/tied-sparse-bf16"), nullptr};
  LoadOptions o;
  o.dtype = DType::bf16;
  o.isa = isa;
  o.matmul_precision = kernels::MatmulPrecision::medium;
  medium.model = load_model(medium.ckpt, o);
  Loaded highest = load("tied-sparse-bf16", DType::bf16, isa);
  const int64_t V = medium.model->config().vocab_size;
  double worst = 0, apart = 0;  // medium vs transformers f32; medium vs highest
  for (const Prompt& p : load_expected("tied-sparse-bf16")) {
    const int steps = static_cast<int>(p.greedy.size());
    const ModelRun r = run_alone(*medium.model, p.ids, steps), h = run_alone(*highest.model, p.ids, steps);
    EXPECT_EQ(r.greedy, p.greedy);
    for (size_t t = 0; t < p.ids.size(); ++t) {
      worst = std::max(worst, row_error(r.prefill.data() + t * V, p.prefill.data() + t * V, V));
      apart = std::max(apart, row_error(r.prefill.data() + t * V, h.prefill.data() + t * V, V));
    }
    for (int s = 0; s < steps; ++s) {
      worst = std::max(worst, row_error(r.decode.data() + s * V, p.decode.data() + s * V, V));
      apart = std::max(apart, row_error(r.decode.data() + s * V, h.decode.data() + s * V, V));
    }
  }
  EXPECT_LT(worst, 3e-2) << isa;
  EXPECT_GT(apart, 1e-4) << isa << ": medium really rounded the activations";
  std::printf("%s: medium vs transformers f32 %.3g, medium vs highest %.3g (max |diff| / max |ref|)\n",
              isa.c_str(), worst, apart);
}

// Each level with bf16 products runs it: AVX512-BF16 (VDPBF16PS) and AMX (TDPBF16PS, linear_bf16tile.hpp);
// the reference emulation where the CPU has neither.
TEST(LinearBf16Dot, TinyModelAtMediumMatchesTransformers) {
  const kernels::CpuFeatures features = kernels::detect_cpu_features();
  bool any = false;
  for (kernels::Isa isa : {kernels::Isa::avx512_bf16, kernels::Isa::amx}) {
    if (!kernels::isa_supported(features, isa)) continue;
    tiny_model_at_medium_matches_transformers(kernels::isa_name(isa));
    any = true;
  }
  if (!any) tiny_model_at_medium_matches_transformers("reference");
}

// `xmoe generate --matmul-precision`: the run's header says which precision ran; a level without bf16
// products, or --dtype f32 (which widens the weights), falls back to highest with a notice; a bad value is
// refused naming the option.
TEST(LinearBf16Dot, GenerateTakesTheFlag) {
  using xmoe::testing_cli::run_cli;
  const std::string base =
      "generate --model " + kModels + "/tied-sparse-bf16 --prompt-ids 1,2,3 --max-tokens 2";
  const bool has_bf16 = kernels::isa_supported(kernels::detect_cpu_features(), kernels::Isa::avx512_bf16);
  const auto medium = run_cli(base + " --matmul-precision medium");
  EXPECT_EQ(medium.code, 0) << medium.output;
  EXPECT_NE(medium.output.find(has_bf16 ? "matmul precision medium" : "matmul precision highest"),
            std::string::npos)
      << medium.output;
  const auto capped = run_cli(base + " --matmul-precision medium --isa avx2");
  if (kernels::isa_supported(kernels::detect_cpu_features(), kernels::Isa::avx2)) {
    EXPECT_EQ(capped.code, 0) << capped.output;
    EXPECT_NE(capped.output.find("notice: --matmul-precision medium needs AVX512-BF16"), std::string::npos)
        << capped.output;
    EXPECT_NE(capped.output.find("matmul precision highest"), std::string::npos) << capped.output;
  }
  const auto widened = run_cli(base + " --matmul-precision medium --dtype f32");
  EXPECT_EQ(widened.code, 0) << widened.output;
  EXPECT_NE(widened.output.find("--dtype f32 widens them"), std::string::npos) << widened.output;
  EXPECT_NE(widened.output.find("matmul precision highest"), std::string::npos) << widened.output;
  const auto bad = run_cli(base + " --matmul-precision fast");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.output.find("--matmul-precision"), std::string::npos) << bad.output;
}

}  // namespace
}  // namespace xmoe::llm::test
