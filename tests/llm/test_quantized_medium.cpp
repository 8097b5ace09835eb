// Quantized Qwen3-MoE checkpoints (FP8 block, MXFP4, NVFP4) at `--matmul-precision medium`
// (kernels/cpu/linear_quant_bf16dot.hpp). Oracle: transformers' fp32 logits on the dequantised weights, as
// for highest, with the bf16 path's tolerance (every linear's input rounded to bf16: 3e-2 of the row's
// largest logit) and greedy ids identical; medium must really differ from highest, and the AVX512-BF16 level
// must give the reference level's logits (its quantized linears are bit-identical to the emulation; the
// elementwise kernels differ in the last bits); where the CPU has AMX, the AMX level within the same bound.
#include <gtest/gtest.h>

#include <cstdio>

#include "kernels/cpu_features.hpp"
#include "llm/model_oracle.hpp"

namespace xmoe::llm {
namespace {

using namespace test;

Loaded load_medium(const std::string& dir, const std::string& isa) {
  Loaded l{Checkpoint::open(kModels + "/" + dir), nullptr};
  LoadOptions o;
  o.dtype = DType::bf16;
  o.isa = isa;
  o.matmul_precision = kernels::MatmulPrecision::medium;
  l.model = load_model(l.ckpt, o);
  return l;
}

TEST(QuantizedMedium, TinyModelsMatchTransformers) {
  const bool has_bf16 = kernels::isa_supported(kernels::detect_cpu_features(), kernels::Isa::avx512_bf16);
  for (const auto& [dir, expected] : {std::pair<const char*, const char*>{"quant-fp8", "quant-fp8"},
                                      {"quant-mxfp4", "quant-mxfp4"},
                                      {"quant-nvfp4-modelopt", "quant-nvfp4"},
                                      {"quant-nvfp4-ct", "quant-nvfp4"}}) {
    Loaded medium = load_medium(dir, has_bf16 ? "avx512_bf16" : "reference");
    Loaded highest = load(dir, DType::bf16);
    const int64_t V = medium.model->config().vocab_size;
    double worst = 0, apart = 0;  // medium vs transformers f32; medium vs highest
    for (const Prompt& p : load_expected(expected)) {
      const int steps = static_cast<int>(p.greedy.size());
      const ModelRun r = run_alone(*medium.model, p.ids, steps), h = run_alone(*highest.model, p.ids, steps);
      EXPECT_EQ(r.greedy, p.greedy) << dir;
      for (size_t t = 0; t < p.ids.size(); ++t) {
        worst = std::max(worst, row_error(r.prefill.data() + t * V, p.prefill.data() + t * V, V));
        apart = std::max(apart, row_error(r.prefill.data() + t * V, h.prefill.data() + t * V, V));
      }
      for (int s = 0; s < steps; ++s) {
        worst = std::max(worst, row_error(r.decode.data() + s * V, p.decode.data() + s * V, V));
        apart = std::max(apart, row_error(r.decode.data() + s * V, h.decode.data() + s * V, V));
      }
    }
    EXPECT_LT(worst, 3e-2) << dir;
    EXPECT_GT(apart, 1e-4) << dir << ": medium really rounded the activations";
    std::printf("%s: medium vs transformers f32 %.3g, medium vs highest %.3g (max |diff| / max |ref|)\n", dir,
                worst, apart);
    if (has_bf16 && kernels::isa_supported(kernels::detect_cpu_features(), kernels::Isa::amx)) {
      // The AMX level (BF16 and FP8 linears in TDPBF16PS's order: linear_bf16tile.hpp,
      // linear_quant_bf16tile.hpp): the same bound
      Loaded tiles = load_medium(dir, "amx");
      double tile_worst = 0;
      for (const Prompt& p : load_expected(expected)) {
        const int steps = static_cast<int>(p.greedy.size());
        const ModelRun r = run_alone(*tiles.model, p.ids, steps);
        EXPECT_EQ(r.greedy, p.greedy) << dir << " amx";
        for (size_t t = 0; t < p.ids.size(); ++t)
          tile_worst = std::max(tile_worst, row_error(r.prefill.data() + t * V, p.prefill.data() + t * V, V));
        for (int s = 0; s < steps; ++s)
          tile_worst = std::max(tile_worst, row_error(r.decode.data() + s * V, p.decode.data() + s * V, V));
      }
      EXPECT_LT(tile_worst, 3e-2) << dir << " amx";
      std::printf("%s: amx medium vs transformers f32 %.3g\n", dir, tile_worst);
    }
    if (!has_bf16) continue;
    Loaded emulated = load_medium(dir, "reference");
    const Prompt p = load_expected(expected).back();
    const ModelRun a = run_alone(*medium.model, p.ids, 3), b = run_alone(*emulated.model, p.ids, 3);
    ASSERT_EQ(a.greedy, b.greedy) << dir;
    for (size_t r = 0; r < a.prefill.size() / V; ++r)
      EXPECT_LT(row_error(a.prefill.data() + r * V, b.prefill.data() + r * V, V), 1e-5) << dir;
    for (size_t r = 0; r < a.decode.size() / V; ++r)
      EXPECT_LT(row_error(a.decode.data() + r * V, b.decode.data() + r * V, V), 1e-5) << dir;
  }
}

}  // namespace
}  // namespace xmoe::llm
