// kernels/hopper/tile_order.h, the order the Hopper attention backward's blocks take their tiles in:
// every (tile, head) exactly once, a group's heads at a rank before any of them at the next, and
// groups that fit the L2 budget.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <utility>

#include "kernels/hopper/tile_order.h"

namespace fsdpq::hopper_order {
namespace {

// Every block index maps to a distinct (rank, head) in range.
void expect_each_tile_once(const TileOrder& o) {
  std::set<std::pair<int, int>> seen;
  for (int block = 0; block < o.ranks * o.heads; ++block) {
    const RankedTile t = ranked_tile(o, block);
    ASSERT_GE(t.rank, 0);
    ASSERT_LT(t.rank, o.ranks);
    ASSERT_GE(t.head, 0);
    ASSERT_LT(t.head, o.heads);
    ASSERT_TRUE(seen.insert({t.rank, t.head}).second) << "block " << block << " repeats a tile";
  }
  EXPECT_EQ(seen.size(), static_cast<size_t>(o.ranks) * o.heads);
}

TEST(HopperTileOrder, EveryTileOfEveryHeadExactlyOnce) {
  for (const TileOrder o : {TileOrder{16, 128, 16}, TileOrder{16, 128, 1}, TileOrder{3, 7, 4}, TileOrder{1, 5, 8},
                            TileOrder{5, 3, 3}, TileOrder{64, 2, 2}})
    expect_each_tile_once(o);
}

TEST(HopperTileOrder, AGroupsHeadsTakeEachRankBeforeTheNext) {
  const TileOrder o{16, 40, 16};  // groups of 16, 16 and 8 heads
  int block = 0;
  for (int first = 0; first < o.heads; first += o.group) {
    const int in_group = std::min(o.group, o.heads - first);
    for (int rank = 0; rank < o.ranks; ++rank)
      for (int i = 0; i < in_group; ++i, ++block) {
        const RankedTile t = ranked_tile(o, block);
        EXPECT_EQ(t.rank, rank) << "block " << block;
        EXPECT_EQ(t.head, first + i) << "block " << block;
      }
  }
}

TEST(HopperTileOrder, GroupsArePowersOfTwoWithinTheL2Budget) {
  const int64_t per_head_t2048 = 2 * 2048 * 128 * 2;  // K and V of one head, bf16: 1 MiB
  EXPECT_EQ(tile_order(16, 128, per_head_t2048).group, 16);
  EXPECT_EQ(tile_order(32, 64, per_head_t2048 * 2).group, 8);    // T 4096
  EXPECT_EQ(tile_order(64, 32, per_head_t2048 * 4).group, 4);   // T 8192
  EXPECT_EQ(tile_order(16, 3, per_head_t2048).group, 3);         // fewer heads than fit: all of them
  EXPECT_EQ(tile_order(16, 8, kL2Budget * 2).group, 1);          // one head over the budget: one at a time
  for (const int64_t heads : {1, 3, 32, 100, 128})
    for (const int64_t bytes : {int64_t{1} << 10, int64_t{1} << 18, int64_t{1} << 20, int64_t{1} << 23}) {
      const TileOrder o = tile_order(kMinRanksToGroup, heads, bytes);
      EXPECT_GE(o.group, 1);
      EXPECT_LE(o.group, heads);
      EXPECT_TRUE(o.group == heads || static_cast<int64_t>(o.group) * bytes <= kL2Budget || o.group == 1);
      expect_each_tile_once(o);
    }
}

TEST(HopperTileOrder, FewTilesPerHeadKeepIndexOrder) {
  // T 512 and 1024 (4 and 8 tiles): head after head, each head's longest tile first.
  for (const int64_t ranks : {int64_t{1}, int64_t{4}, kMinRanksToGroup - 1}) {
    const TileOrder o = tile_order(ranks, 128, 1 << 10);
    EXPECT_EQ(o.group, 1);
    for (int block = 0; block < o.ranks * o.heads; ++block) {
      const RankedTile t = ranked_tile(o, block);
      EXPECT_EQ(t.head, block / o.ranks);
      EXPECT_EQ(t.rank, block % o.ranks);
    }
  }
}

}  // namespace
}  // namespace fsdpq::hopper_order
