#include "moe/losses.hpp"

#include <cmath>
#include <vector>

namespace xmoe::moe {

template <class Acc>
double gshard_loss(const Acc* scores, const int32_t* first_ids, int64_t T, int E, double daux, Acc* dscores) {
  if (T == 0) return 0.0;
  std::vector<double> count(static_cast<size_t>(E), 0.0), me(static_cast<size_t>(E), 0.0);
  for (int64_t t = 0; t < T; ++t) count[static_cast<size_t>(first_ids[t])] += 1.0;
  for (int64_t t = 0; t < T; ++t)
    for (int e = 0; e < E; ++e) me[static_cast<size_t>(e)] += scores[t * E + e];
  const double scale = static_cast<double>(E) / (static_cast<double>(T) * static_cast<double>(T));
  double l = 0;
  for (int e = 0; e < E; ++e) l += me[static_cast<size_t>(e)] * count[static_cast<size_t>(e)];
  if (dscores && daux != 0.0)
    for (int64_t t = 0; t < T; ++t)
      for (int e = 0; e < E; ++e)
        dscores[t * E + e] += static_cast<Acc>(daux * scale * count[static_cast<size_t>(e)]);
  return l * scale;
}

namespace {
// cv²-style balance: l = var(v) / (mean(v)² + 1e-10) with the unbiased variance; returns ∂l/∂v too.
double balance(const std::vector<double>& v, std::vector<double>& grad) {
  const auto n = static_cast<double>(v.size());
  double mean = 0;
  for (double x : v) mean += x;
  mean /= n;
  double ss = 0;
  for (double x : v) ss += (x - mean) * (x - mean);
  const double var = ss / (n - 1), denom = mean * mean + 1e-10;
  grad.resize(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    grad[i] = 2.0 * (v[i] - mean) / (n - 1) / denom - var * (2.0 * mean / n) / (denom * denom);
  return var / denom;
}
}  // namespace

template <class Acc>
double importance_load_loss(const Acc* clean, const Acc* noisy, const int32_t* kth_ids, int64_t T, int E,
                            double gate_noise, double daux, Acc* dclean, Acc* dnoisy) {
  const auto En = static_cast<size_t>(E);
  const double sigma = gate_noise / E;
  std::vector<double> imp(En, 0.0), load(En, 0.0), gimp, gload;
  for (int64_t t = 0; t < T; ++t) {
    const double thr = noisy[t * E + kth_ids[t]];
    for (int e = 0; e < E; ++e) {
      imp[static_cast<size_t>(e)] += clean[t * E + e];
      const double z = (clean[t * E + e] - thr) / sigma;
      load[static_cast<size_t>(e)] += 0.5 * std::erfc(-z * M_SQRT1_2);
    }
  }
  const double l = 0.5 * (balance(imp, gimp) + balance(load, gload));
  if (dclean && dnoisy && daux != 0.0) {
    for (int64_t t = 0; t < T; ++t) {
      const double thr = noisy[t * E + kth_ids[t]];
      double dthr = 0;
      for (int e = 0; e < E; ++e) {
        const double z = (clean[t * E + e] - thr) / sigma;
        const double pdf = std::exp(-0.5 * z * z) * 0.3989422804014327;
        const double dz = 0.5 * daux * gload[static_cast<size_t>(e)] * pdf / sigma;
        dclean[t * E + e] += static_cast<Acc>(0.5 * daux * gimp[static_cast<size_t>(e)] + dz);
        dthr -= dz;
      }
      dnoisy[t * E + kth_ids[t]] += static_cast<Acc>(dthr);
    }
  }
  return l;
}

template double gshard_loss<float>(const float*, const int32_t*, int64_t, int, double, float*);
template double gshard_loss<double>(const double*, const int32_t*, int64_t, int, double, double*);
template double importance_load_loss<float>(const float*, const float*, const int32_t*, int64_t, int, double,
                                            double, float*, float*);
template double importance_load_loss<double>(const double*, const double*, const int32_t*, int64_t, int,
                                             double, double, double*, double*);

}  // namespace xmoe::moe
