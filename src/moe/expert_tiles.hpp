// Work items for running many experts' products as one parallel schedule: (range, output column tile)
// pairs sized from the routing histogram, so a heavily routed expert's columns are cut into narrow tiles and
// a lightly routed one's into few wide ones, and every tile costs about the same. Which thread runs a tile
// never changes a bit: each output element belongs to exactly one tile, and the kernels' summation order
// depends only on k.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "moe/experts.hpp"

namespace xmoe::moe {

struct ExpertTile {
  int32_t range = 0;       // index into the ranges the tiles were planned for
  int64_t n0 = 0, n1 = 0;  // output columns
};

// Streaming one weight row costs about as much as this many x rows' FMAs over it (decode is bound by the
// weight stream, prefill by the FMAs); a tile's cost is its columns × (rows + this).
inline constexpr int64_t kWeightCostRows = 4;
// Tile edges fall on multiples of this (the kernels' register and panel tiles: 8 and 16 weight rows).
inline constexpr int64_t kTileColumns = 16;

// Tiles covering columns [0, n) of every nonempty range once, in range order then column order, each of
// about total cost / (threads · 8) (never narrower than 2 · kTileColumns, never across ranges), and at least
// `threads` per range where n allows, so the threads stream a lightly routed expert's weight side by side.
// One thread: one tile per range.
void plan_expert_tiles(std::span<const ExpertRange> ranges, int64_t n, int threads,
                       std::vector<ExpertTile>& tiles);

}  // namespace xmoe::moe
