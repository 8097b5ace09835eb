#include "moe/expert_tiles.hpp"

#include <algorithm>

namespace xmoe::moe {

namespace {

// Enough tiles per thread that dynamic scheduling evens out unequal tiles and a thread the OS delays.
constexpr int64_t kTilesPerThread = 8;

}  // namespace

void plan_expert_tiles(std::span<const ExpertRange> ranges, int64_t n, int threads,
                       std::vector<ExpertTile>& tiles) {
  tiles.clear();
  if (n <= 0) return;
  int64_t total = 0;
  for (const ExpertRange& r : ranges) total += r.end > r.begin ? n * (r.end - r.begin + kWeightCostRows) : 0;
  const int64_t target = threads <= 1 ? total : std::max<int64_t>(1, total / (threads * kTilesPerThread));
  for (size_t i = 0; i < ranges.size(); ++i) {
    const int64_t rows = ranges[i].end - ranges[i].begin;
    if (rows <= 0) continue;
    const int64_t width = std::max(2 * kTileColumns, target / (rows + kWeightCostRows));
    // At least one tile per thread, so the threads stream one expert's weight side by side (decode's
    // bandwidth-bound experts run as fast as the old column split of each product).
    const int64_t wanted = std::max<int64_t>(threads, (n + width - 1) / width);
    const int64_t count = std::max<int64_t>(1, std::min(n / kTileColumns, wanted));
    // Nearly equal tiles with edges on kTileColumns (the last one takes the remainder).
    const int64_t units = (n + kTileColumns - 1) / kTileColumns;
    for (int64_t t = 0; t < count; ++t) {
      const int64_t n0 = units * t / count * kTileColumns;
      const int64_t n1 = t + 1 == count ? n : units * (t + 1) / count * kTileColumns;
      tiles.push_back({static_cast<int32_t>(i), n0, n1});
    }
  }
}

}  // namespace xmoe::moe
