// The summation order every f32/bf16/f16 linear kernel variant shares: lane l (0..15) takes the products
// p ≡ l (mod 16) in ascending p as one FMA chain; then the lanes are added as a fixed pairwise tree (l + 8,
// l + 4, l + 2, l + 1). Each output depends only on its own dot product, never on m, n, the block it falls in
// or the thread count, so a sequence's results do not depend on what else is in the batch.
#pragma once

namespace xmoe::kernels {

inline float reduce_lanes(float* lanes) {
  for (int width = 8; width >= 1; width /= 2)
    for (int l = 0; l < width; ++l) lanes[l] += lanes[l + width];
  return lanes[0];
}

}  // namespace xmoe::kernels
