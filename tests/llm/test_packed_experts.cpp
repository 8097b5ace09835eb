// The MoE experts' one-schedule path (PackedSwigluExperts::forward_rows over expert_tiles.hpp's work items)
// against three oracles: the per-expert path it replaced (each product through the threaded linear driver,
// then the activation, then down — written out here), bit for bit; each row run alone as a decode step, bit
// for bit (a row's result does not depend on its batch); and a double-precision product over the weights as
// PackedWeight::row_to_f32 decodes them (checked against PyTorch in test_quant_formats.cpp), to a tolerance.
// Every weight format, both gate/up layouts, every kernel level on this CPU, 1, 2 and 3 threads, and
// prefill- and decode-shaped routing histograms.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu_features.hpp"
#include "kernels/kernels.hpp"
#include "kernels/linear.hpp"
#include "kernels/quant/quantize.hpp"
#include "moe/expert_tiles.hpp"
#include "moe/packed_experts.hpp"
#include "owned_weight.hpp"
#include "xmoe/dtype.hpp"
#include "xmoe/error.hpp"

namespace xmoe::moe {
namespace {

using kernels::PackedWeight;
using kernels::WeightFormat;

using test_weights::make_weight;
using test_weights::OwnedWeight;

bool quantized(WeightFormat f) {
  return f != WeightFormat::f32 && f != WeightFormat::bf16;
}

std::vector<float> random_values(size_t n, std::mt19937& rng, float scale) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// E experts of model_dim M and hidden I in one format and layout. Separate layout: even experts hold gate
// and up in one allocation (the joined gate_up view), odd ones in two (the gate and up products apart).
struct ExpertSet {
  ExpertSet(WeightFormat f, const ExpertDescriptor& d, int E, int64_t M, int64_t I, uint32_t seed)
      : descriptor(d), M(M), I(I) {
    std::mt19937 rng(seed);
    const bool interleaved = d.gate_up_layout == GateUpLayout::interleaved;
    for (int e = 0; e < E; ++e) {
      SwigluWeights w;
      const auto keep = [&](std::unique_ptr<OwnedWeight> o) {
        owned.push_back(std::move(o));
        return owned.back()->view;
      };
      const std::vector<float> gate_up = random_values(static_cast<size_t>(2 * I * M), rng, 0.08f);
      const bool one_allocation = interleaved || (e % 2 == 0 && !quantized(f));
      if (one_allocation) {
        const PackedWeight both = keep(make_weight(f, gate_up, 2 * I, M));
        if (interleaved) {
          w.gate_up = both;
        } else {
          w.gate = kernels::slice_rows(both, 0, I);
          w.up = kernels::slice_rows(both, I, I);
        }
      } else {  // block scales are quantized per projection (a slice need not start a scale block)
        w.gate = keep(make_weight(f, {gate_up.begin(), gate_up.begin() + I * M}, I, M));
        w.up = keep(make_weight(f, {gate_up.begin() + I * M, gate_up.end()}, I, M));
      }
      w.down = keep(make_weight(f, random_values(static_cast<size_t>(M * I), rng, 0.08f), M, I));
      if (d.gate_up_bias) w.gate_up_bias = random_values(static_cast<size_t>(2 * I), rng, 0.5f);
      if (d.down_bias) w.down_bias = random_values(static_cast<size_t>(M), rng, 0.5f);
      weights.push_back(std::move(w));
    }
  }
  ExpertDescriptor descriptor;
  int64_t M, I;
  std::vector<std::unique_ptr<OwnedWeight>> owned;
  std::vector<SwigluWeights> weights;
};

std::vector<float> run_schedule(const ExpertSet& s, const kernels::KernelTable& t,
                                const std::vector<float>& x, const std::vector<ExpertRange>& ranges,
                                int64_t R) {
  PackedSwigluExperts experts(s.weights, t, s.descriptor);
  std::vector<float> y(static_cast<size_t>(R * s.M), -7.0f);
  experts.forward_rows(x.data(), ranges, R, y.data());
  return y;
}

// The path forward_rows took before the one schedule: expert after expert, each product through the
// threaded linear driver.
std::vector<float> run_per_expert(const ExpertSet& s, const kernels::KernelTable& t,
                                  const std::vector<float>& x, const std::vector<ExpertRange>& ranges,
                                  int64_t R) {
  const int64_t M = s.M, I = s.I;
  const bool table_silu = s.descriptor.activation == GatedActivation::swiglu &&
                          s.descriptor.gate_up_layout == GateUpLayout::separate;
  std::vector<float> y(static_cast<size_t>(R * M), -7.0f), gu(static_cast<size_t>(2 * I)), act;
  for (const ExpertRange& rg : ranges) {
    const SwigluWeights& w = s.weights[static_cast<size_t>(rg.expert)];
    const int64_t r = rg.end - rg.begin;
    if (r == 0) continue;
    gu.assign(static_cast<size_t>(r * 2 * I), 0.0f);
    act.assign(static_cast<size_t>(r * I), 0.0f);
    const float* xe = x.data() + rg.begin * M;
    if (w.gate_up.rows > 0) {
      kernels::linear_forward(t, w.gate_up, xe, r, M, gu.data(), 2 * I);
    } else {
      kernels::linear_forward(t, w.gate, xe, r, M, gu.data(), 2 * I);
      kernels::linear_forward(t, w.up, xe, r, M, gu.data() + I, 2 * I);
    }
    for (int64_t i = 0; i < r; ++i) {
      float* row = gu.data() + i * 2 * I;
      for (size_t j = 0; j < w.gate_up_bias.size(); ++j) row[j] += w.gate_up_bias[j];
      if (table_silu)
        t.silu_mul_f32(row, row + I, act.data() + i * I, I);
      else
        gated_activation_row(s.descriptor, row, act.data() + i * I, I);
    }
    float* ye = y.data() + rg.begin * M;
    kernels::linear_forward(t, w.down, act.data(), r, I, ye, M);
    for (int64_t i = 0; i < r; ++i)
      for (size_t j = 0; j < w.down_bias.size(); ++j) ye[i * M + static_cast<int64_t>(j)] += w.down_bias[j];
  }
  return y;
}

// In double over the decoded weights, the activation from its formula (transformers' SiLU and gpt-oss's
// clamped SwiGLU).
std::vector<float> run_in_double(const ExpertSet& s, const std::vector<float>& x,
                                 const std::vector<ExpertRange>& ranges, int64_t R) {
  const int64_t M = s.M, I = s.I;
  const auto decode = [](const PackedWeight& w) {
    std::vector<float> out(static_cast<size_t>(w.rows * w.cols));
    for (int64_t r = 0; r < w.rows; ++r) w.row_to_f32(r, out.data() + r * w.cols);
    return out;
  };
  const bool inter = s.descriptor.gate_up_layout == GateUpLayout::interleaved;
  std::vector<float> y(static_cast<size_t>(R * M), -7.0f);
  for (const ExpertRange& rg : ranges) {
    const SwigluWeights& w = s.weights[static_cast<size_t>(rg.expert)];
    std::vector<float> gu = w.gate_up.rows > 0 ? decode(w.gate_up) : decode(w.gate);
    if (w.gate_up.rows == 0) {
      const std::vector<float> up = decode(w.up);
      gu.insert(gu.end(), up.begin(), up.end());
    }
    const std::vector<float> down = decode(w.down);
    for (int64_t row = rg.begin; row < rg.end; ++row) {
      std::vector<double> h(static_cast<size_t>(2 * I)), a(static_cast<size_t>(I));
      for (int64_t n = 0; n < 2 * I; ++n) {
        double acc = w.gate_up_bias.empty() ? 0.0 : w.gate_up_bias[static_cast<size_t>(n)];
        for (int64_t k = 0; k < M; ++k)
          acc += double(x[static_cast<size_t>(row * M + k)]) * gu[static_cast<size_t>(n * M + k)];
        h[static_cast<size_t>(n)] = acc;
      }
      for (int64_t j = 0; j < I; ++j) {
        double g = h[static_cast<size_t>(inter ? 2 * j : j)],
               u = h[static_cast<size_t>(inter ? 2 * j + 1 : I + j)];
        if (s.descriptor.activation == GatedActivation::swiglu) {
          a[static_cast<size_t>(j)] = g / (1.0 + std::exp(-g)) * u;
        } else {
          const double limit = s.descriptor.limit;
          g = std::min(g, limit);
          u = std::clamp(u, -limit, limit);
          a[static_cast<size_t>(j)] = (u + 1.0) * g / (1.0 + std::exp(-g * s.descriptor.alpha));
        }
      }
      for (int64_t n = 0; n < M; ++n) {
        double acc = w.down_bias.empty() ? 0.0 : w.down_bias[static_cast<size_t>(n)];
        for (int64_t k = 0; k < I; ++k)
          acc += a[static_cast<size_t>(k)] * down[static_cast<size_t>(n * I + k)];
        y[static_cast<size_t>(row * M + n)] = static_cast<float>(acc);
      }
    }
  }
  return y;
}

struct Routing {
  const char* name;
  std::vector<ExpertRange> ranges;
  int64_t rows;
};

// Prefill-shaped: a skewed histogram (one expert takes most rows, one none), ranges not in expert order.
// Decode-shaped: a few experts with one or two rows each.
std::vector<Routing> routings() {
  return {{"prefill", {{3, 0, 5}, {0, 5, 42}, {1, 42, 43}, {2, 43, 43}, {5, 43, 62}, {4, 62, 64}}, 64},
          {"decode", {{4, 0, 1}, {1, 1, 3}, {5, 3, 4}, {0, 4, 5}}, 5}};
}

std::vector<kernels::Isa> levels() {
  const kernels::CpuFeatures f = kernels::detect_cpu_features();
  std::vector<kernels::Isa> out;
  for (const kernels::Isa isa :
       {kernels::Isa::reference, kernels::Isa::avx2, kernels::Isa::avx512, kernels::Isa::avx512_bf16})
    if (kernels::isa_supported(f, isa)) out.push_back(isa);
  return out;
}

int bit_mismatches(const std::vector<float>& a, const std::vector<float>& b) {
  int bad = 0;
  for (size_t i = 0; i < a.size(); ++i) bad += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return bad;
}

double rel_error(const std::vector<float>& got, const std::vector<float>& want) {
  double diff = 0, ref = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff = std::max(diff, std::abs(double(got[i]) - want[i]));
    ref = std::max(ref, std::abs(double(want[i])));
  }
  return diff / ref;
}

// Model dim 256, hidden 160: big enough that the schedule runs 3 threads even for the decode histogram, and
// 2I = 320 cut into tiles with one edge inside a projection (the separate layout's gate/up boundary at 160
// falls inside a tile for some plans).
constexpr int kExperts = 6;
constexpr int64_t kModel = 256, kHidden = 160;

void check(WeightFormat format, const ExpertDescriptor& descriptor, int64_t model = kModel) {
  const ExpertSet s(format, descriptor, kExperts, model, kHidden, 17);
  const int saved = omp_get_max_threads();
  for (const Routing& routing : routings()) {
    std::mt19937 rng(5);
    const std::vector<float> x = random_values(static_cast<size_t>(routing.rows * model), rng, 1.0f);
    const std::vector<float> exact = run_in_double(s, x, routing.ranges, routing.rows);
    for (const kernels::Isa isa : levels()) {
      const kernels::KernelTable& t = kernels::kernel_table(isa, kernels::detect_cpu_features());
      const std::string what = std::string(kernels::weight_format_name(format)) + " " +
                               descriptor.describe() + " " + kernels::isa_name(isa) + " " + routing.name;
      omp_set_num_threads(2);
      const std::vector<float> old_path = run_per_expert(s, t, x, routing.ranges, routing.rows);
      EXPECT_LT(rel_error(old_path, exact), 2e-5) << what;
      for (int threads : {1, 2, 3}) {
        omp_set_num_threads(threads);
        EXPECT_EQ(bit_mismatches(run_schedule(s, t, x, routing.ranges, routing.rows), old_path), 0)
            << what << ", " << threads << " threads against the per-expert path";
      }
      // Each row alone, as one decode step of its expert, gets the bits it got in the batch.
      omp_set_num_threads(3);
      for (const ExpertRange& rg : routing.ranges)
        for (int64_t row = rg.begin; row < rg.end; row += 3) {
          const std::vector<float> one(x.begin() + row * model, x.begin() + (row + 1) * model);
          const std::vector<float> alone = run_schedule(s, t, one, {{rg.expert, 0, 1}}, 1);
          const std::vector<float> in_batch(old_path.begin() + row * model,
                                            old_path.begin() + (row + 1) * model);
          EXPECT_EQ(bit_mismatches(alone, in_batch), 0) << what << ", row " << row << " alone";
        }
    }
  }
  omp_set_num_threads(saved);
}

TEST(PackedExperts, F32) {
  check(WeightFormat::f32, ExpertDescriptor::qwen3());
}
TEST(PackedExperts, Bf16) {
  check(WeightFormat::bf16, ExpertDescriptor::qwen3());
}
TEST(PackedExperts, Fp8Block) {
  check(WeightFormat::fp8_block, ExpertDescriptor::qwen3());
}
TEST(PackedExperts, Mxfp4) {
  check(WeightFormat::mxfp4, ExpertDescriptor::qwen3());
}
TEST(PackedExperts, Nvfp4) {
  check(WeightFormat::nvfp4, ExpertDescriptor::qwen3());
}
TEST(PackedExperts, InterleavedWithBiasesBf16) {
  check(WeightFormat::bf16, ExpertDescriptor::gpt_oss(1.702f, 7.0f));
}
TEST(PackedExperts, InterleavedWithBiasesMxfp4) {
  check(WeightFormat::mxfp4, ExpertDescriptor::gpt_oss(1.702f, 7.0f));
}

// Model dim 1024: at decode the down tiles are wide enough (kFusedActivationColumns) that each computes its
// rows' activation itself instead of the shared activation pass; the bits must not change. Checked that the
// plan really is all wide tiles for the decode histogram at 1 thread (and not for prefill at 3), so both
// forms run.
constexpr int64_t kWideModel = 1024;
TEST(PackedExperts, WideDownTilesActivateTheirOwnRows) {
  const auto all_wide = [](const Routing& r, int threads) {
    std::vector<ExpertTile> tiles;
    plan_expert_tiles(r.ranges, kWideModel, threads, tiles);
    return std::all_of(tiles.begin(), tiles.end(),
                       [](const ExpertTile& t) { return t.n1 - t.n0 >= kFusedActivationColumns; });
  };
  EXPECT_TRUE(all_wide(routings()[1], 1));
  EXPECT_FALSE(all_wide(routings()[0], 3));
  check(WeightFormat::bf16, ExpertDescriptor::qwen3(), kWideModel);
  check(WeightFormat::nvfp4, ExpertDescriptor::qwen3(), kWideModel);
  check(WeightFormat::mxfp4, ExpertDescriptor::gpt_oss(1.702f, 7.0f), kWideModel);
}

// A kernel's error inside the parallel schedule comes out as the error it threw (not std::terminate).
TEST(PackedExperts, KernelErrorInsideTheScheduleIsThrown) {
  ExpertSet s(WeightFormat::fp8_block, ExpertDescriptor::qwen3(), kExperts, kModel, kHidden, 17);
  s.weights[5].down.scales = nullptr;
  const Routing routing = routings()[0];
  std::mt19937 rng(5);
  const std::vector<float> x = random_values(static_cast<size_t>(routing.rows * kModel), rng, 1.0f);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(3);
  try {
    run_schedule(s, kernels::best_kernel_table(kernels::detect_cpu_features()), x, routing.ranges,
                 routing.rows);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("without data or scales"), std::string::npos) << e.what();
  }
  omp_set_num_threads(saved);
}

// The plan: every column of every nonempty range in exactly one tile, edges on kTileColumns, at least one
// tile per thread for every range, and a heavily routed expert cut finer than a lightly routed one so tiles
// cost about the same.
TEST(ExpertTiles, CoverEachColumnOnceBalancedByRows) {
  const std::vector<ExpertRange> ranges = {{0, 0, 200}, {1, 200, 201}, {2, 201, 201}, {3, 201, 233}};
  for (const int64_t n : {int64_t{20}, int64_t{320}, int64_t{1536}}) {
    for (int threads : {1, 2, 3}) {
      std::vector<ExpertTile> tiles;
      plan_expert_tiles(ranges, n, threads, tiles);
      std::vector<std::vector<int>> covered(ranges.size(), std::vector<int>(static_cast<size_t>(n)));
      std::vector<int> count(ranges.size());
      for (const ExpertTile& t : tiles) {
        ASSERT_TRUE(t.range >= 0 && t.range < int(ranges.size()) && 0 <= t.n0 && t.n0 < t.n1 && t.n1 <= n);
        EXPECT_TRUE(t.n0 % kTileColumns == 0 && (t.n1 == n || t.n1 % kTileColumns == 0));
        for (int64_t c = t.n0; c < t.n1; ++c) ++covered[static_cast<size_t>(t.range)][static_cast<size_t>(c)];
        ++count[static_cast<size_t>(t.range)];
      }
      for (size_t r = 0; r < ranges.size(); ++r) {
        const int want = ranges[r].end > ranges[r].begin ? 1 : 0;
        EXPECT_EQ(std::count(covered[r].begin(), covered[r].end(), want), n) << "range " << r << " n " << n;
      }
      if (threads == 1) {
        EXPECT_EQ(tiles.size(), 3u);  // one tile per nonempty range
      }
      if (threads > 1 && n == 1536) {
        EXPECT_GT(count[0], count[3]);
        EXPECT_GT(count[3], count[1]);
        EXPECT_EQ(count[1], threads);  // a light expert still gets one tile per thread
        // The largest tile costs at most twice the smallest one that could be split further.
        double most = 0, least = 1e300;
        for (const ExpertTile& t : tiles) {
          const double rows =
              double(ranges[static_cast<size_t>(t.range)].end - ranges[static_cast<size_t>(t.range)].begin);
          const double cost = double(t.n1 - t.n0) * (rows + kWeightCostRows);
          most = std::max(most, cost);
          if (count[static_cast<size_t>(t.range)] > threads) least = std::min(least, cost);  // cut by cost
        }
        EXPECT_LT(most, 2.0 * least);
      }
    }
  }
}

}  // namespace
}  // namespace xmoe::moe
