// Picks the next token from a row of logits: penalties, temperature and truncation (top-k, top-p, min-p),
// then a draw from a per-request counter-based generator.
//
// Order, as transformers' generate() and vLLM apply them:
//   1. repetition penalty (HF RepetitionPenaltyLogitsProcessor: a logit of a token seen in prompt or output
//   is
//      divided by the penalty when positive, multiplied when negative),
//   2. frequency then presence penalty (OpenAI / vLLM: logit -= frequency * count + presence * (count > 0),
//      counting generated tokens only),
//   3. temperature (logits / T; T = 0 means greedy: the argmax after the penalties, lowest id on ties),
//   4. top-k (keep tokens whose logit is >= the k-th largest),
//   5. top-p (HF TopPLogitsWarper: drop tokens whose ascending cumulative probability is <= 1 - p),
//   6. min-p (drop tokens whose probability is < min_p × the largest probability),
// then softmax over the survivors and one draw.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace xmoe::llm {

struct SamplingParams {
  double temperature = 1.0;         // 0 = greedy
  int top_k = 0;                    // 0 = off
  double top_p = 1.0;               // 1 = off; (0, 1]
  double min_p = 0.0;               // 0 = off; [0, 1]
  double repetition_penalty = 1.0;  // 1 = off; > 0
  double presence_penalty = 0.0;
  double frequency_penalty = 0.0;
  std::optional<uint64_t> seed;  // absent: the engine picks one per request

  // Throws xmoe::Error naming the first out-of-range field.
  void validate() const;
  bool greedy() const { return temperature == 0.0; }
};

// What the penalties need to know about one sequence: tokens seen in prompt + output (repetition penalty) and
// how often each generated token occurred (presence / frequency penalties).
class PenaltyState {
 public:
  void add_prompt(std::span<const int32_t> tokens);
  void add_generated(int32_t token);
  void apply(const SamplingParams& params, std::span<float> logits) const;

 private:
  std::unordered_set<int32_t> seen_;  // prompt and generated tokens
  std::unordered_map<int32_t, int32_t> generated_counts_;
};

// A filtered distribution: the surviving token ids (in an order fixed by the logits alone) and their
// probabilities (sum 1).
struct TokenDistribution {
  std::vector<int32_t> tokens;
  std::vector<double> probs;
};

// Steps 3-6 on logits that already carry the penalties (params.temperature must be > 0).
TokenDistribution filtered_distribution(std::span<const float> logits, const SamplingParams& params);

// Index of the largest logit (the lowest id among equal ones).
int32_t argmax_token(std::span<const float> logits);

// Inverse-CDF draw from `dist` with uniform u in (0, 1).
int32_t draw_token(const TokenDistribution& dist, double u);

// A request's sampler: the n-th generated token uses uniform number n of the request's seed, so a result does
// not depend on what else is batched with the request, on thread count, or on preemption and recompute.
class Sampler {
 public:
  Sampler(const SamplingParams& params, uint64_t seed);
  const SamplingParams& params() const { return params_; }
  // `logits` is modified in place (penalties); `index` is the position of the token in the output (0-based).
  int32_t sample(std::span<float> logits, const PenaltyState& penalties, uint64_t index) const;

 private:
  SamplingParams params_;
  uint64_t seed_;
};

}  // namespace xmoe::llm
