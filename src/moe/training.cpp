#include "xmoe/training.hpp"

#include <cmath>
#include <vector>

#include "xmoe/error.hpp"

namespace xmoe {

void average_shared_gradients(MoeLayer& layer, Communicator& group) {
  const double inv = 1.0 / group.size();
  for (Parameter* p : layer.parameters()) {
    if (p->is_expert) continue;
    Tensor& g = p->grad;
    const auto n = static_cast<size_t>(g.numel());
    // Scale first, then sum (Tutel's examples divide by W before the all-reduce).
    if (g.dtype() == DType::f32) {
      float* d = g.data<float>();
      for (size_t i = 0; i < n; ++i) d[i] = static_cast<float>(d[i] * inv);
      std::vector<float> sum(n);
      group.all_reduce(d, sum.data(), n, ElementType::f32, ReduceOp::sum);
      std::copy(sum.begin(), sum.end(), d);
    } else {
      double* d = g.data<double>();
      for (size_t i = 0; i < n; ++i) d[i] *= inv;
      std::vector<double> sum(n);
      group.all_reduce(d, sum.data(), n, ElementType::f64, ReduceOp::sum);
      std::copy(sum.begin(), sum.end(), d);
    }
  }
}

namespace {

Tensor& state_for(std::map<std::string, Tensor>& states, const Parameter& p) {
  auto it = states.find(p.name);
  if (it == states.end()) it = states.emplace(p.name, Tensor::zeros(p.grad.shape(), p.grad.dtype())).first;
  XMOE_CHECK(it->second.shape() == p.grad.shape(), "optimizer: parameter '", p.name, "' changed shape");
  return it->second;
}

}  // namespace

Sgd::Sgd(SgdOptions options) : o_(options) {
  XMOE_CHECK(o_.lr > 0 && std::isfinite(o_.lr), "sgd.lr: must be positive, got ", o_.lr);
  XMOE_CHECK(o_.momentum >= 0 && o_.momentum < 1, "sgd.momentum: must be in [0, 1), got ", o_.momentum);
}

void Sgd::step(MoeLayer& layer) {
  for (Parameter* p : layer.parameters()) {
    Tensor* buf = o_.momentum > 0 ? &state_for(momentum_, *p) : nullptr;
    const int64_t n = p->value.numel();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      double d = p->grad.get(i) + o_.weight_decay * p->value.get(i);
      if (buf) {
        d = o_.momentum * buf->get(i) + d;
        buf->set(i, d);
      }
      p->value.set(i, p->value.get(i) - o_.lr * d);
    }
  }
  layer.zero_grad();
}

Adam::Adam(AdamOptions options) : o_(options) {
  XMOE_CHECK(o_.lr > 0 && std::isfinite(o_.lr), "adam.lr: must be positive, got ", o_.lr);
  XMOE_CHECK(o_.beta1 >= 0 && o_.beta1 < 1, "adam.beta1: must be in [0, 1), got ", o_.beta1);
  XMOE_CHECK(o_.beta2 >= 0 && o_.beta2 < 1, "adam.beta2: must be in [0, 1), got ", o_.beta2);
  XMOE_CHECK(o_.eps > 0, "adam.eps: must be positive, got ", o_.eps);
}

void Adam::step(MoeLayer& layer) {
  ++t_;
  const double c1 = 1.0 - std::pow(o_.beta1, static_cast<double>(t_));
  const double c2 = 1.0 - std::pow(o_.beta2, static_cast<double>(t_));
  for (Parameter* p : layer.parameters()) {
    Tensor& m = state_for(m_, *p);
    Tensor& v = state_for(v_, *p);
    const int64_t n = p->value.numel();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const double g = p->grad.get(i);
      const double mi = o_.beta1 * m.get(i) + (1 - o_.beta1) * g;
      const double vi = o_.beta2 * v.get(i) + (1 - o_.beta2) * g * g;
      m.set(i, mi);
      v.set(i, vi);
      double w = p->value.get(i);
      if (o_.weight_decay > 0) w -= o_.lr * o_.weight_decay * w;
      p->value.set(i, w - o_.lr * (mi / c1) / (std::sqrt(vi / c2) + o_.eps));
    }
  }
  layer.zero_grad();
}

}  // namespace xmoe
