// Auxiliary load-balancing losses (Tutel impls/losses.py) and their gradients.
#pragma once
#include <cstdint>

namespace xmoe::moe {

// GShard: l = E/T² · Σ_e (Σ_t scores[t,e]) · count1_e, count1 = tokens whose first choice is e.
// Adds daux·∂l/∂scores into dscores when dscores is non-null.
template <class Acc>
double gshard_loss(const Acc* scores, const int32_t* first_ids, int64_t tokens, int num_experts, double daux,
                   Acc* dscores);

// Importance + load (needs gate_noise > 0): clean = softmax(logits), thr[t] = noisy logit of the k-th choice.
// Adds gradients into dclean [T, E] and dnoisy [T, E] (at the k-th choice) when they are non-null.
template <class Acc>
double importance_load_loss(const Acc* clean, const Acc* noisy_logits, const int32_t* kth_ids, int64_t tokens,
                            int num_experts, double gate_noise, double daux, Acc* dclean, Acc* dnoisy);

}  // namespace xmoe::moe
