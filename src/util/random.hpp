// Counter-based random numbers: the same seed gives the same values on every platform and thread count.
#pragma once
#include <cmath>
#include <cstdint>

namespace xmoe {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

class CounterRng {
 public:
  explicit CounterRng(uint64_t seed, uint64_t stream = 0) : key_(splitmix64(seed ^ splitmix64(stream))) {}
  // Uniform in (0, 1), never exactly 0 or 1.
  double uniform(uint64_t i) const {
    return (static_cast<double>(splitmix64(key_ + i) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
  }
  // Standard normal (Box-Muller on two uniforms).
  double normal(uint64_t i) const {
    const double u1 = uniform(2 * i), u2 = uniform(2 * i + 1);
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  uint64_t key_;
};

}  // namespace xmoe
