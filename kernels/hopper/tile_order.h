// The order in which the Hopper attention backward's blocks start. The block scheduler starts
// blocks in index order, and a block's work grows with its tile's distance from the causal edge
// (dk, dv: key tile kt is seen by the query tiles from kt on; dq: query tile qt sees the key tiles
// up to qt). Tiles in index order, head after head (rank fastest), leave the long blocks of the
// last heads running alone at the end: 7% over the work's lower bound at B 4, T 2048, H 32 (list
// scheduling on 132 SMs). Longest first across every head would end evenly but spread the blocks
// in flight over all heads, whose operands would then stream from HBM instead of L2. So heads come
// in groups whose operands fit in kL2Budget together, and within a group blocks go by rank: rank 0
// (the longest tile) of each of the group's heads, then rank 1, and so on (1.6% over the bound).
// Measured on the H100 (bench/RESULTS.md, stop 39), the backward at T 2048 / 4096 / 8192 gains
// 2 / 2 / 6%, but at 512 and 1024 loses 6-10%: a mix of long and short blocks in flight shares the
// GPU better than blocks of one length, and with few tiles per head the tail is short anyway. So
// heads with fewer than kMinRanksToGroup tiles keep index order (a group of one head), and so does
// the forward (within ±1.3% at T >= 2048).
// Plain C++17 for host and device, so the CPU tests check the order.
#pragma once
#include <cstdint>

#include "kernels/host_device.h"

namespace fsdpq::hopper_order {

struct TileOrder {
  int ranks;  // tiles per head
  int heads;  // heads of the whole launch (batch × heads per example)
  int group;  // heads per group
};

// A block's tile: its rank (0: the longest) and its head (b · heads per example + h).
struct RankedTile {
  int rank, head;
};

FSDPQ_HOST_DEVICE_INLINE RankedTile ranked_tile(const TileOrder& o, int block) {
  const int per_group = o.group * o.ranks;
  const int g = block / per_group, r = block % per_group;
  const int rest = o.heads - g * o.group;
  const int in_group = rest < o.group ? rest : o.group;  // the last group may be smaller
  return RankedTile{r / in_group, g * o.group + r % in_group};
}

// Operands a group's blocks read from L2 together: a third of the H100's and H200's 50 MiB.
inline constexpr int64_t kL2Budget = int64_t{16} << 20;
// Tiles per head from which grouping pays (T 2048 with 128-row tiles).
inline constexpr int64_t kMinRanksToGroup = 16;

// `head_bytes`: the operands one head's blocks stream (the keys and values of dq, the queries and
// output gradients of dk, dv). The group is the largest power of two (the usual
// head counts' divisors, which leave no short last group) within kL2Budget, at least one head and
// at most all of them; one (index order) below kMinRanksToGroup tiles.
inline TileOrder tile_order(int64_t ranks, int64_t heads, int64_t head_bytes) {
  int64_t group = 1;
  while (ranks >= kMinRanksToGroup && group < heads && 2 * group * head_bytes <= kL2Budget) group *= 2;
  return TileOrder{static_cast<int>(ranks), static_cast<int>(heads), static_cast<int>(group < heads ? group : heads)};
}

}  // namespace fsdpq::hopper_order
