// MLA's attention core (MlaAttention::attend) in both forms, on every kernel level this CPU runs: against a
// double-precision evaluation of transformers' DeepseekV3Attention formula (k_nope and v expanded from the
// latents by kv_b_proj, softmax over q·k · scale), the absorbed and expanded forms against each other (a
// tight bound: they differ only in summation order), and bit-identical results for 1, 2 and 3 threads and for
// each sequence alone versus inside a batch of other sequences (decode rows and prefill chunks mixed). Shapes
// are odd on purpose: more query heads than a head group splits into, widths that are not multiples of the
// vector lanes, cache blocks shorter than the attention chunk. (The model-level oracle against transformers
// is tests/llm/test_deepseek_v3.cpp and test_glm4_moe.cpp.)
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu_features.hpp"
#include "kernels/kernels.hpp"
#include "llm/arch/mla_attention.hpp"
#include "llm/kv_cache.hpp"

namespace xmoe::llm {
namespace {

using kernels::Isa;

constexpr int kHeads = 20, kRank = 40, kRope = 8, kNope = 12, kV = 10;
constexpr int kLatent = kRank + kRope, kQk = kNope + kRope;

// A chunk of a step: `rows` query rows of one sequence at positions [start, start + rows).
struct Chunk {
  int64_t start, rows;
};

// A layer with random kv_b_proj, a cache whose sequences hold random latents, random queries per chunk.
struct Fixture {
  std::vector<float> kv_b;
  MlaDims dims;
  std::unique_ptr<KvCache> cache;
  std::vector<Chunk> chunks;
  std::vector<SequenceId> ids;
  std::vector<std::vector<float>> q;       // per chunk [rows, heads·qk]
  std::vector<std::vector<float>> latent;  // per chunk's sequence [positions, kLatent] as stored

  Fixture(std::vector<Chunk> cs, DType dtype, int block_size, uint32_t seed) : chunks(std::move(cs)) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    kv_b.resize(static_cast<size_t>(kHeads) * (kNope + kV) * kRank);
    for (float& x : kv_b) x = uni(rng) * 0.3f;
    dims.heads = kHeads, dims.kv_lora_rank = kRank, dims.qk_nope = kNope, dims.qk_rope = kRope;
    dims.v_head = kV, dims.scale = 0.7f / std::sqrt(static_cast<float>(kQk));
    cache = std::make_unique<KvCache>(KvCacheShape{1, 1, 1, {}, {kLatent}}, dtype, 1 << 22, block_size);
    for (const Chunk& c : chunks) {
      const SequenceId id = cache->create_sequence();
      const int64_t len = c.start + c.rows;
      EXPECT_TRUE(cache->reserve(id, len));
      std::vector<float> lat(static_cast<size_t>(len * kLatent));
      for (int64_t p = 0; p < len; ++p) {
        void* block = cache->latent_block(0, cache->block_of(id, 0, p));
        for (int i = 0; i < kLatent; ++i) {
          float v = uni(rng) * 2.0f;
          if (dtype == DType::bf16) {
            const bf16 b(v);
            static_cast<bf16*>(block)[(p % block_size) * kLatent + i] = b;
            v = static_cast<float>(b);
          } else {
            static_cast<float*>(block)[(p % block_size) * kLatent + i] = v;
          }
          lat[static_cast<size_t>(p * kLatent + i)] = v;
        }
      }
      ids.push_back(id);
      latent.push_back(std::move(lat));
      std::vector<float> qc(static_cast<size_t>(c.rows * kHeads * kQk));
      for (float& x : qc) x = uni(rng);
      q.push_back(std::move(qc));
    }
  }

  MlaAttention layer(MlaForm form) const {
    MlaWeights w;
    w.kv_b.rows = int64_t{kHeads} * (kNope + kV), w.kv_b.cols = kRank;
    w.kv_b.data = reinterpret_cast<const std::byte*>(kv_b.data());
    w.kv_b.row_bytes = kRank * static_cast<int64_t>(sizeof(float));
    w.kv_a_norm.assign(kRank, 1.0f);
    return MlaAttention(dims, std::move(w), form);
  }

  // Chunks `which` (in that order) as one step; per chunk its [rows, heads·v] output.
  std::vector<std::vector<float>> run(const kernels::KernelTable& table, MlaForm form,
                                      const std::vector<size_t>& which, int threads) const {
    StepRows step;
    std::vector<float> qs;
    step.first.push_back(0);
    for (size_t i = 0; i < which.size(); ++i) {
      const Chunk& c = chunks[which[i]];
      step.seq.push_back(ids[which[i]]);
      step.start.push_back(c.start);
      step.first.push_back(step.first.back() + c.rows);
      for (int64_t r = 0; r < c.rows; ++r) step.chunk_of.push_back(static_cast<int64_t>(i));
      qs.insert(qs.end(), q[which[i]].begin(), q[which[i]].end());
    }
    std::vector<float> attn(static_cast<size_t>(step.rows() * kHeads * kV), -7.0f);
    const MlaAttention mla = layer(form);
    const int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    MlaScratch scratch;
    mla.attend(table, *cache, 0, step, qs.data(), attn.data(), scratch);
    omp_set_num_threads(saved);
    std::vector<std::vector<float>> out;
    for (size_t i = 0; i < which.size(); ++i)
      out.emplace_back(attn.begin() + step.first[i] * kHeads * kV,
                       attn.begin() + step.first[i + 1] * kHeads * kV);
    return out;
  }

  // transformers' formula in double: k_nope = W_UK c, v = W_UV c per head and position, scores scaled.
  std::vector<double> expected(size_t ci) const {
    const Chunk& c = chunks[ci];
    const int64_t len = c.start + c.rows, per_head = kNope + kV;
    const std::vector<float>& lat = latent[ci];
    std::vector<double> out(static_cast<size_t>(c.rows * kHeads * kV));
    for (int h = 0; h < kHeads; ++h) {
      std::vector<double> k(static_cast<size_t>(len * kQk)), v(static_cast<size_t>(len * kV));
      for (int64_t p = 0; p < len; ++p) {
        const float* cp = lat.data() + p * kLatent;
        for (int i = 0; i < kNope + kV; ++i) {
          double acc = 0;
          for (int r = 0; r < kRank; ++r)
            acc += double{kv_b[static_cast<size_t>((h * per_head + i) * kRank + r)]} * cp[r];
          if (i < kNope)
            k[static_cast<size_t>(p * kQk + i)] = acc;
          else
            v[static_cast<size_t>(p * kV + i - kNope)] = acc;
        }
        for (int i = 0; i < kRope; ++i) k[static_cast<size_t>(p * kQk + kNope + i)] = cp[kRank + i];
      }
      for (int64_t r = 0; r < c.rows; ++r) {
        const int64_t pos = c.start + r;
        const float* qr = q[ci].data() + (r * kHeads + h) * kQk;
        std::vector<double> s(static_cast<size_t>(pos + 1));
        for (int64_t p = 0; p <= pos; ++p) {
          double dot = 0;
          for (int i = 0; i < kQk; ++i) dot += double{qr[i]} * k[static_cast<size_t>(p * kQk + i)];
          s[static_cast<size_t>(p)] = dot * dims.scale;
        }
        const double m = *std::max_element(s.begin(), s.end());
        double sum = 0;
        for (double& x : s) sum += (x = std::exp(x - m));
        for (int j = 0; j < kV; ++j) {
          double acc = 0;
          for (int64_t p = 0; p <= pos; ++p)
            acc += s[static_cast<size_t>(p)] * v[static_cast<size_t>(p * kV + j)];
          out[static_cast<size_t>((r * kHeads + h) * kV + j)] = acc / sum;
        }
      }
    }
    return out;
  }
};

std::vector<Isa> levels() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::reference, Isa::avx2, Isa::avx512, Isa::avx512_bf16})
    if (kernels::isa_supported(kernels::detect_cpu_features(), isa)) out.push_back(isa);
  return out;
}

// Largest |got − want| over max |want|.
template <class A, class B>
double relative_error(const std::vector<A>& got, const std::vector<B>& want) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff = std::max(diff, std::abs(double{got[i]} - double{want[i]}));
    scale = std::max(scale, std::abs(double{want[i]}));
  }
  return diff / scale;
}

// Decode rows deep into a context and at position 0, prefill chunks from the start and appended to a
// context, crossing cache blocks.
const std::vector<Chunk> kChunks = {{37, 1}, {0, 9}, {0, 1}, {21, 6}, {5, 1}, {0, 23}};

TEST(MlaAttention, BothFormsMatchTheDoubleFormulaAndEachOtherOnEveryLevel) {
  for (DType dtype : {DType::f32, DType::bf16}) {
    const Fixture f(kChunks, dtype, 4, 7);
    std::vector<size_t> all(kChunks.size());
    for (size_t i = 0; i < all.size(); ++i) all[i] = i;
    for (Isa isa : levels()) {
      SCOPED_TRACE(std::string(kernels::isa_name(isa)) + (dtype == DType::f32 ? " f32" : " bf16") + " cache");
      const kernels::KernelTable& table = kernels::kernel_table(isa, kernels::detect_cpu_features());
      const auto absorbed = f.run(table, MlaForm::absorbed, all, 2);
      const auto expanded = f.run(table, MlaForm::expanded, all, 2);
      for (size_t c = 0; c < all.size(); ++c) {
        const std::vector<double> want = f.expected(c);
        EXPECT_LT(relative_error(absorbed[c], want), 2e-6) << "chunk " << c << " absorbed";
        EXPECT_LT(relative_error(expanded[c], want), 2e-6) << "chunk " << c << " expanded";
        EXPECT_LT(relative_error(absorbed[c], expanded[c]), 2e-6) << "chunk " << c;
        EXPECT_NE(absorbed[c], expanded[c]) << "chunk " << c << ": the forms should round differently";
      }
    }
  }
}

TEST(MlaAttention, BitIdenticalAcrossThreadCountsAndBatches) {
  const Fixture f(kChunks, DType::bf16, 4, 11);
  std::vector<size_t> all(kChunks.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  std::vector<size_t> decodes = {0, 2, 4}, reversed(all.rbegin(), all.rend());
  for (Isa isa : levels()) {
    const kernels::KernelTable& table = kernels::kernel_table(isa, kernels::detect_cpu_features());
    for (MlaForm form : {MlaForm::automatic, MlaForm::absorbed, MlaForm::expanded}) {
      SCOPED_TRACE(std::string(kernels::isa_name(isa)) + " form " + std::to_string(static_cast<int>(form)));
      const auto batch = f.run(table, form, all, 2);
      for (int threads : {1, 3}) EXPECT_EQ(f.run(table, form, all, threads), batch) << threads << " threads";
      const auto back = f.run(table, form, reversed, 2);
      const auto only_decodes = f.run(table, form, decodes, 3);
      for (size_t c = 0; c < all.size(); ++c) {
        EXPECT_EQ(back[all.size() - 1 - c], batch[c]) << "chunk " << c << " in the reversed batch";
        const int threads = 1 + static_cast<int>(c % 3);
        EXPECT_EQ(f.run(table, form, {c}, threads)[0], batch[c])
            << "chunk " << c << " alone, " << threads << " threads";
      }
      for (size_t i = 0; i < decodes.size(); ++i) EXPECT_EQ(only_decodes[i], batch[decodes[i]]);
    }
  }
}

}  // namespace
}  // namespace xmoe::llm
