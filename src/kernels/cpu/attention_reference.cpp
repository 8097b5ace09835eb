// The plain attention work item the vector variants are tested against: the same walk and online softmax
// (attention_tile.hpp) with scalar loops and std::exp.
#include <cmath>
#include <limits>

#include "kernels/cpu/attention_tile.hpp"
#include "kernels/cpu/variants.hpp"

namespace xmoe::kernels::reference {

namespace {

struct Ops {
  static constexpr int64_t kLanes = 1;
  static constexpr bool kReadsBf16InPlace = false;  // always widens each chunk (attention_tile.hpp)

  static void widen(const uint16_t* src, float* dst, int64_t n) {
    attention_detail::widen_bf16(src, dst, 0, n);
  }

  static void qk(const float* qt, int64_t mp, int64_t /*queries*/, int64_t lanes, const float* kf,
                 int64_t kf_ld, int dk, float scale, float* s) {
    for (int64_t p = 0; p < kAttentionChunk; ++p)
      for (int64_t i = 0; i < lanes; ++i) {
        float acc = 0.0f;
        for (int d = 0; d < dk; ++d) acc += kf[p * kf_ld + d] * qt[d * mp + i];
        s[p * mp + i] = acc * scale;
      }
  }

  static void softmax_step(float* s, int64_t mp, int64_t lanes, float* m, float* l, float* alpha) {
    constexpr float kNegInf = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < lanes; ++i) {
      float mx = m[i];
      for (int64_t p = 0; p < kAttentionChunk; ++p) mx = std::max(mx, s[p * mp + i]);
      alpha[i] = mx == m[i] || mx == kNegInf ? 1.0f : std::exp(m[i] - mx);
      float sum = 0.0f;
      for (int64_t p = 0; p < kAttentionChunk; ++p) {
        float& e = s[p * mp + i];
        e = mx == kNegInf ? 0.0f : std::exp(e - mx);
        sum += e;
      }
      l[i] = l[i] * alpha[i] + sum;
      m[i] = mx;
    }
  }

  static void scale_row(float* o, float a, int64_t n) {
    for (int64_t c = 0; c < n; ++c) o[c] *= a;
  }

  static void pv(const float* s, int64_t mp, int64_t rows, const float* vf, int64_t dvp, float* o) {
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t p = 0; p < kAttentionChunk; ++p) {
        const float w = s[p * mp + i];
        for (int64_t c = 0; c < dvp; ++c) o[i * dvp + c] += w * vf[p * dvp + c];
      }
  }
};

}  // namespace

void attention_tile(const AttentionArgs& args, const AttentionItem& item, float* scratch) {
  attention_detail::attention_tile<Ops>(args, item, scratch);
}

}  // namespace xmoe::kernels::reference
