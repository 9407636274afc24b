// The MPI transport of the collectives interface on 4 ranks, and the process groups of every
// sharding strategy (hybrid with ranks_per_node = 2 emulates 2 nodes of 2).
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "fsdp/collectives.h"
#include "fsdp/process_groups.h"
#include "fsdp/staged_communicator.h"
#include "runtime/world.h"
#include "test_support.h"

namespace fsdpq {
namespace {

World make_world() { return describe_world(detect_launcher()); }

// Distinct, non-zero values per (rank, index).
float value_of(int rank, size_t i) { return static_cast<float>(rank + 1) * 1000.0f + static_cast<float>(i) * 0.5f + 0.25f; }

void check_collectives(Communicator& c) {
  const int R = c.size(), me = c.rank();
  // all-gather: 2 granules per rank, async with the handle waited later.
  const size_t bytes = 2 * Communicator::kAllGatherGranule;
  std::vector<uint8_t> send(bytes), recv(bytes * static_cast<size_t>(R), 0);
  for (size_t i = 0; i < bytes; ++i) send[i] = static_cast<uint8_t>(me * 31 + i * 7 + 1);
  CollectiveHandle gather = c.all_gather(send.data(), recv.data(), bytes);
  EXPECT_TRUE(gather.pending() || R == 1);
  gather.wait();
  for (int r = 0; r < R; ++r)
    for (size_t i = 0; i < bytes; ++i)
      ASSERT_EQ(recv[static_cast<size_t>(r) * bytes + i], static_cast<uint8_t>(r * 31 + i * 7 + 1)) << r << " " << i;
  EXPECT_THROW(c.all_gather(send.data(), recv.data(), 10), std::logic_error);

  // reduce-scatter: rank `me` gets the sum over ranks of block `me`.
  const size_t per = 5;
  std::vector<float> rs_send(per * static_cast<size_t>(R)), rs_recv(per);
  for (size_t i = 0; i < rs_send.size(); ++i) rs_send[i] = value_of(me, i);
  c.reduce_scatter(rs_send.data(), rs_recv.data(), per, CommType::F32, ReduceOp::Sum).wait();
  for (size_t i = 0; i < per; ++i) {
    float want = 0;
    for (int r = 0; r < R; ++r) want += value_of(r, static_cast<size_t>(me) * per + i);
    EXPECT_FLOAT_EQ(rs_recv[i], want);
  }

  // all-reduce sum / max / min in place, and the scalar helpers.
  std::vector<double> v = {static_cast<double>(me) + 0.5, -static_cast<double>(me)};
  c.all_reduce(v.data(), 2, CommType::F64, ReduceOp::Max).wait();
  EXPECT_EQ(v[0], R - 0.5);
  EXPECT_EQ(v[1], 0.0);
  std::vector<int64_t> m = {me + 10};
  c.all_reduce(m.data(), 1, CommType::I64, ReduceOp::Min).wait();
  EXPECT_EQ(m[0], 10);
  EXPECT_DOUBLE_EQ(c.all_reduce_sum(1.5), 1.5 * R);
  EXPECT_EQ(c.all_reduce_sum(int64_t{me}), int64_t{R} * (R - 1) / 2);
  EXPECT_EQ(c.any(me == R - 1), true);
  EXPECT_EQ(c.any(false), false);

  // broadcast from the last rank.
  std::vector<uint8_t> b(17, static_cast<uint8_t>(me));
  c.broadcast(b.data(), b.size(), R - 1).wait();
  for (uint8_t x : b) EXPECT_EQ(x, R - 1);
  c.barrier();
}

TEST(MpiCollectives, WorldOfFour) {
  World w = make_world();
  ASSERT_EQ(w.size, 4);
  auto c = make_mpi_communicator(w.comm, "world");
  EXPECT_EQ(c->size(), 4);
  EXPECT_EQ(c->rank(), w.rank);
  check_collectives(*c);
}

// The device-buffer adapter over MPI (fsdp/staged_communicator.h) with host "device" buffers: the
// same results as MPI itself, through the staging copies (the GPU tests run it on CUDA memory).
TEST(StagedCollectives, WorldOfFourAndGroups) {
  World w = make_world();
  auto c = make_staged_communicator(make_mpi_communicator(w.comm, "world"), Device::CPU);
  EXPECT_EQ(c->size(), 4);
  EXPECT_EQ(c->rank(), w.rank);
  EXPECT_EQ(c->name(), "world");
  check_collectives(*c);
  ProcessGroups g = make_process_groups(w, ShardingStrategy::HybridFullShard, 2);
  check_collectives(*make_staged_communicator(make_mpi_communicator(MPI_COMM_SELF, "self"), Device::CPU));
  // The colours the device collectives split the world with give the same groups.
  MPI_Comm shard;
  MPI_Comm_split(w.comm, g.shard_color, w.rank, &shard);
  auto staged_shard = make_staged_communicator(make_mpi_communicator(shard, "shard"), Device::CPU);
  MPI_Comm_free(&shard);
  EXPECT_EQ(staged_shard->size(), g.shard->size());
  EXPECT_EQ(staged_shard->rank(), g.shard->rank());
  EXPECT_EQ(staged_shard->all_reduce_sum(int64_t{w.rank}), g.shard->all_reduce_sum(int64_t{w.rank}));
}

TEST(MpiCollectives, GroupOfOneIsALocalCopy) {
  auto c = make_mpi_communicator(MPI_COMM_SELF, "self");
  EXPECT_EQ(c->size(), 1);
  check_collectives(*c);
}

TEST(ProcessGroups, EveryStrategy) {
  World w = make_world();
  struct Want {
    ShardingStrategy strategy;
    int shard, replicate;
  };
  for (Want want : {Want{ShardingStrategy::FullShard, 4, 1}, Want{ShardingStrategy::ShardGradOp, 4, 1},
                    Want{ShardingStrategy::Ddp, 1, 4}, Want{ShardingStrategy::HybridFullShard, 2, 2},
                    Want{ShardingStrategy::HybridShardGradOp, 2, 2}}) {
    SCOPED_TRACE(sharding_strategy_name(want.strategy));
    ProcessGroups g = make_process_groups(w, want.strategy, 2);
    EXPECT_EQ(g.world->size(), 4);
    EXPECT_EQ(g.shard->size(), want.shard);
    EXPECT_EQ(g.replicate->size(), want.replicate);
    if (want.strategy == ShardingStrategy::HybridFullShard) {
      // Emulated nodes are blocks of 2: ranks {0,1} and {2,3} shard; {0,2} and {1,3} replicate.
      EXPECT_EQ(g.shard->rank(), w.rank % 2);
      EXPECT_EQ(g.replicate->rank(), w.rank / 2);
      EXPECT_EQ(g.nodes, 2);
      // The shard group's sum covers exactly the node's ranks.
      EXPECT_EQ(g.shard->all_reduce_sum(int64_t{w.rank}), w.rank < 2 ? 1 : 5);
      EXPECT_EQ(g.replicate->all_reduce_sum(int64_t{w.rank}), w.rank % 2 == 0 ? 2 : 4);
    }
    check_collectives(*g.shard);
    check_collectives(*g.replicate);
  }
}

TEST(ProcessGroups, RanksPerNodeMustDivideTheWorld) {
  World w = make_world();
  EXPECT_EQ(test::error_of([&] { make_process_groups(w, ShardingStrategy::HybridFullShard, 3); }),
            "ranks_per_node = 3 does not divide the 4 ranks of this job into whole nodes");
  EXPECT_EQ(test::error_of([&] { parse_sharding_strategy("fsdp"); }),
            "sharding_strategy = 'fsdp' is not a strategy: use full_shard, shard_grad_op, ddp, hybrid_full_shard or "
            "hybrid_shard_grad_op");
}

}  // namespace
}  // namespace fsdpq
