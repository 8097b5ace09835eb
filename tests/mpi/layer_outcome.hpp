// What the expert-parallel tests compare: one forward and backward of a layer, and the relative difference
// of two results.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "util/random.hpp"
#include "xmoe/moe_layer.hpp"

namespace xmoe::test {

inline Tensor random_tensor(const Shape& s, DType dtype, uint64_t seed) {
  Tensor t = Tensor::empty(s, dtype);
  CounterRng rng(seed);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, rng.normal(static_cast<uint64_t>(i)));
  return t;
}

struct Outcome {
  Tensor y, dx;
  double aux = 0;
  std::vector<Tensor> grads;  // in parameters() order
};

// Forward x, backward dy with aux-loss weight 0.5; the gradients are copied after the backward.
inline Outcome forward_backward(MoeLayer& layer, const Tensor& x, const Tensor& dy, const Switches& switches,
                                bool zero_grad = true) {
  if (zero_grad) layer.zero_grad();
  Outcome o;
  ForwardResult f = layer.forward(x, switches);
  o.y = f.y;
  o.aux = f.aux_loss;
  o.dx = layer.backward(dy, 0.5);
  for (Parameter* p : layer.parameters()) o.grads.push_back(p->grad.clone());
  return o;
}

// max |a − b| over max |b|: b is the reference.
inline double max_rel_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.numel(), b.numel());
  double diff = 0, scale = 1e-30;
  for (int64_t i = 0; i < b.numel() && i < a.numel(); ++i) {
    diff = std::max(diff, std::fabs(a.get(i) - b.get(i)));
    scale = std::max(scale, std::fabs(b.get(i)));
  }
  return diff / scale;
}

}  // namespace xmoe::test
