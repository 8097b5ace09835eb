#include "llm/sampler.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>

#include "util/random.hpp"
#include "xmoe/error.hpp"

namespace xmoe::llm {

void SamplingParams::validate() const {
  XMOE_CHECK(std::isfinite(temperature) && temperature >= 0.0, "sampling: temperature must be >= 0, got ",
             temperature);
  XMOE_CHECK(top_k >= 0, "sampling: top_k must be >= 0 (0 = off), got ", top_k);
  XMOE_CHECK(top_p > 0.0 && top_p <= 1.0, "sampling: top_p must be in (0, 1], got ", top_p);
  XMOE_CHECK(min_p >= 0.0 && min_p <= 1.0, "sampling: min_p must be in [0, 1], got ", min_p);
  XMOE_CHECK(std::isfinite(repetition_penalty) && repetition_penalty > 0.0,
             "sampling: repetition_penalty must be > 0, got ", repetition_penalty);
  XMOE_CHECK(std::isfinite(presence_penalty), "sampling: presence_penalty must be finite");
  XMOE_CHECK(std::isfinite(frequency_penalty), "sampling: frequency_penalty must be finite");
}

void PenaltyState::add_prompt(std::span<const int32_t> tokens) {
  seen_.insert(tokens.begin(), tokens.end());
}

void PenaltyState::add_generated(int32_t token) {
  seen_.insert(token);
  ++generated_counts_[token];
}

void PenaltyState::apply(const SamplingParams& params, std::span<float> logits) const {
  const auto vocab = static_cast<int64_t>(logits.size());
  if (params.repetition_penalty != 1.0) {
    const auto penalty = static_cast<float>(params.repetition_penalty);
    for (int32_t t : seen_) {
      if (t < 0 || t >= vocab) continue;  // a prompt id past the model's vocabulary has no logit to change
      float& l = logits[t];
      l = l > 0 ? l / penalty : l * penalty;
    }
  }
  if (params.frequency_penalty != 0.0 || params.presence_penalty != 0.0) {
    for (const auto& [t, count] : generated_counts_) {
      if (t < 0 || t >= vocab) continue;
      logits[t] -= static_cast<float>(params.frequency_penalty * count + params.presence_penalty);
    }
  }
}

// A scan that carries the best index so far waits on the previous comparison at every logit (3.5 ns each
// on Zen 4: 0.5 ms for a 152k vocabulary, a batch-1 decode step's largest serial part). Instead the largest
// value is found by independent lanes, which vectorise, and then its first position. The answer is the
// scan's (tests/llm/test_sampler.cpp keeps it as the reference): a NaN never wins unless it is first, when
// nothing can beat it; ties, -0 with +0 included, go to the lowest id.
int32_t argmax_token(std::span<const float> logits) {
  XMOE_CHECK(!logits.empty(), "sampler: empty logits row");
  const float first = logits[0];
  if (std::isnan(first)) return 0;
  constexpr size_t kLanes = 16;
  const size_t n = logits.size(), whole = n / kLanes * kLanes;
  float lane_best[kLanes];
  std::fill(lane_best, lane_best + kLanes, first);
  for (size_t i = 0; i < whole; i += kLanes)
    for (size_t l = 0; l < kLanes; ++l)
      lane_best[l] = logits[i + l] > lane_best[l] ? logits[i + l] : lane_best[l];
  float best = first;
  for (const float v : lane_best) best = v > best ? v : best;
  for (size_t i = whole; i < n; ++i) best = logits[i] > best ? logits[i] : best;
  for (size_t i = 0; i < whole; i += kLanes) {
    bool here = false;
    for (size_t l = 0; l < kLanes; ++l) here |= logits[i + l] == best;
    if (!here) continue;
    for (size_t l = 0;; ++l)
      if (logits[i + l] == best) return static_cast<int32_t>(i + l);
  }
  for (size_t i = whole;; ++i)
    if (logits[i] == best) return static_cast<int32_t>(i);
}

namespace {

struct Candidate {
  double logit;
  int32_t token;
};

// Most probable first; equal logits by id so the order depends on the logits alone.
bool before(const Candidate& a, const Candidate& b) {
  return a.logit > b.logit || (a.logit == b.logit && a.token < b.token);
}

// Keeps the candidates whose probability mass ranked above them is < top_p (HF: ascending cumulative
// probability <= 1 - top_p is dropped). Instead of sorting the whole vocabulary, candidates go into buckets
// by logit distance from the largest: buckets whose cumulative mass stays below top_p are kept whole, later
// ones dropped whole, and only the bucket where the mass crosses top_p is sorted and walked token by token.
// The plain version (one full sort) is the reference in tests/llm/test_sampler.cpp.
void apply_top_p(std::vector<Candidate>& cands, double top_p, double max_logit) {
  constexpr int kBuckets = 2048;
  constexpr double kBucketsPerUnit = kBuckets / 32.0;  // logits further than 32 below the top share the last
  std::vector<double> mass(kBuckets, 0.0);
  std::vector<uint16_t> bucket_of(cands.size());
  double total = 0;
  for (size_t i = 0; i < cands.size(); ++i) {
    const double distance = max_logit - cands[i].logit;
    const double b = std::min(distance * kBucketsPerUnit, static_cast<double>(kBuckets - 1));
    bucket_of[i] = static_cast<uint16_t>(b);
    const double p = std::exp(-distance);
    mass[bucket_of[i]] += p;
    total += p;
  }
  int crossing = 0;
  double mass_before = 0;  // of the buckets before `crossing`
  for (; crossing < kBuckets; ++crossing) {
    if ((mass_before + mass[crossing]) / total >= top_p) break;
    mass_before += mass[crossing];
  }
  if (crossing == kBuckets) return;  // rounding left the whole mass below top_p: keep everything
  std::vector<Candidate> kept, boundary;
  for (size_t i = 0; i < cands.size(); ++i) {
    if (bucket_of[i] < crossing) kept.push_back(cands[i]);
    if (bucket_of[i] == crossing) boundary.push_back(cands[i]);
  }
  std::sort(boundary.begin(), boundary.end(), before);
  double cumulative = mass_before / total;
  for (const Candidate& c : boundary) {
    if (cumulative >= top_p) break;
    kept.push_back(c);
    cumulative += std::exp(c.logit - max_logit) / total;
  }
  cands = std::move(kept);
}

void check_logit(std::span<const float> logits, size_t i) {
  XMOE_CHECK(!std::isnan(logits[i]) && logits[i] != INFINITY, "sampler: logit of token ", i, " is ",
             logits[i]);
}

// Values per block that the top-k passes test at once before looking at them one by one.
constexpr size_t kSkipBlock = 64;

// Top-k by partial selection: one pass keeps the k largest logits (with repeats) in a min-heap, so the k-th
// largest is known without ranking the vocabulary, and only the logits at or above it become candidates,
// in `before` order. The cut is made on the float logits, which is the cut on logit / temperature (a
// monotone map) unless two floats map to one double: then the float just below the k-th would tie with it
// and nullopt sends the caller to the full path. Also nullopt when k does not truncate.
std::optional<std::vector<Candidate>> top_k_candidates(std::span<const float> logits, int top_k,
                                                       double temperature) {
  const auto k = static_cast<size_t>(top_k);
  std::vector<float> heap;  // min-heap of the k largest finite logits so far
  heap.reserve(k);
  size_t finite = 0;
  const auto visit = [&](size_t i) {
    const float l = logits[i];
    if (!(l > -INFINITY && l < INFINITY)) {
      check_logit(logits, i);
      return;
    }
    ++finite;
    if (heap.size() < k) {
      heap.push_back(l);
      std::push_heap(heap.begin(), heap.end(), std::greater<>());
    } else if (l > heap.front()) {
      std::pop_heap(heap.begin(), heap.end(), std::greater<>());
      heap.back() = l;
      std::push_heap(heap.begin(), heap.end(), std::greater<>());
    }
  };
  // Once the heap is full almost every value is finite and not above its least: a block of such values only
  // adds to `finite`, and one count over the block (written so that the compiler vectorises it) replaces a
  // branch per value. A block with anything else (a larger, non-finite or NaN value: every comparison with
  // NaN is false) is visited value by value as before.
  const size_t n = logits.size();
  size_t i = 0;
  while (i < n) {
    if (heap.size() == k && i + kSkipBlock <= n) {
      const float least = heap.front();
      size_t quiet = 0;
      for (size_t j = i; j < i + kSkipBlock; ++j) quiet += (logits[j] <= least) & (logits[j] > -INFINITY);
      if (quiet == kSkipBlock) {
        finite += kSkipBlock;
        i += kSkipBlock;
        continue;
      }
      for (const size_t end = i + kSkipBlock; i < end; ++i) visit(i);
      continue;
    }
    visit(i++);
  }
  XMOE_CHECK(finite > 0, "sampler: every logit is -inf");
  if (finite <= k) return std::nullopt;
  const float kth = heap.front();
  const double kth_scaled = static_cast<double>(kth) / temperature;
  if (static_cast<double>(std::nextafter(kth, -INFINITY)) / temperature == kth_scaled) return std::nullopt;
  std::vector<Candidate> cands;
  for (size_t b = 0; b < n; b += kSkipBlock) {
    const size_t end = std::min(n, b + kSkipBlock);
    size_t below = 0;  // all below the k-th: no candidate in the block (no NaN: checked above)
    for (size_t j = b; j < end; ++j) below += logits[j] < kth;
    if (below == end - b) continue;
    for (size_t j = b; j < end; ++j)
      if (logits[j] >= kth && logits[j] < INFINITY)
        cands.push_back({static_cast<double>(logits[j]) / temperature, static_cast<int32_t>(j)});
  }
  std::sort(cands.begin(), cands.end(), before);
  return cands;
}

}  // namespace

TokenDistribution filtered_distribution(std::span<const float> logits, const SamplingParams& params) {
  XMOE_CHECK(params.temperature > 0.0, "sampler: filtered_distribution needs temperature > 0");
  std::optional<std::vector<Candidate>> selected;
  if (params.top_k > 0) selected = top_k_candidates(logits, params.top_k, params.temperature);
  std::vector<Candidate> cands;
  if (selected) {
    cands = std::move(*selected);
  } else {
    cands.reserve(logits.size());
    for (size_t i = 0; i < logits.size(); ++i) {
      check_logit(logits, i);
      if (logits[i] != -INFINITY)
        cands.push_back({static_cast<double>(logits[i]) / params.temperature, static_cast<int32_t>(i)});
    }
    XMOE_CHECK(!cands.empty(), "sampler: every logit is -inf");
    if (params.top_k > 0 && static_cast<size_t>(params.top_k) < cands.size()) {
      std::nth_element(cands.begin(), cands.begin() + (params.top_k - 1), cands.end(), before);
      const double kth = cands[static_cast<size_t>(params.top_k - 1)].logit;
      std::erase_if(cands, [kth](const Candidate& c) { return c.logit < kth; });  // ties with the k-th stay
    }
  }
  double max_logit = -INFINITY;
  for (const Candidate& c : cands) max_logit = std::max(max_logit, c.logit);
  if (params.top_p < 1.0) apply_top_p(cands, params.top_p, max_logit);
  if (params.min_p > 0.0) {
    // p / p_max = exp(l - l_max): the threshold needs no normalisation.
    std::erase_if(cands, [&](const Candidate& c) { return std::exp(c.logit - max_logit) < params.min_p; });
  }

  TokenDistribution dist;
  dist.tokens.reserve(cands.size());
  dist.probs.reserve(cands.size());
  double total = 0;
  for (const Candidate& c : cands) {
    dist.tokens.push_back(c.token);
    dist.probs.push_back(std::exp(c.logit - max_logit));
    total += dist.probs.back();
  }
  for (double& p : dist.probs) p /= total;
  return dist;
}

int32_t draw_token(const TokenDistribution& dist, double u) {
  XMOE_CHECK(!dist.tokens.empty(), "sampler: empty distribution");
  double cumulative = 0;
  for (size_t i = 0; i < dist.tokens.size(); ++i) {
    cumulative += dist.probs[i];
    if (u < cumulative) return dist.tokens[i];
  }
  return dist.tokens.back();  // u above the rounded total
}

Sampler::Sampler(const SamplingParams& params, uint64_t seed) : params_(params), seed_(seed) {
  params_.validate();
}

int32_t Sampler::sample(std::span<float> logits, const PenaltyState& penalties, uint64_t index) const {
  penalties.apply(params_, logits);
  if (params_.greedy()) return argmax_token(logits);
  const TokenDistribution dist = filtered_distribution(logits, params_);
  return draw_token(dist, CounterRng(seed_).uniform(index));
}

}  // namespace xmoe::llm
