// Which ranks shard parameters together and which hold replicas, per `sharding_strategy`:
//   full_shard, shard_grad_op   shard over the whole world; no replicas
//   ddp                         no sharding (a shard group of one); replicated over the world
//   hybrid_full_shard,
//   hybrid_shard_grad_op        shard within a node, replicate across nodes (node = the ranks
//                               sharing memory, or blocks of `ranks_per_node` consecutive ranks)
// Gradients are reduce-scattered over the shard group, then all-reduced over the replicate group.
#pragma once
#include <memory>
#include <string>

#include "fsdp/collectives.h"
#include "fsdp/sharding_strategy.h"
#include "runtime/world.h"

namespace fsdpq {

struct ProcessGroups {
  ShardingStrategy strategy = ShardingStrategy::FullShard;
  std::unique_ptr<Communicator> world;      // every rank: losses, norms, flags, checkpoints
  std::unique_ptr<Communicator> shard;      // parameters are split over these ranks
  std::unique_ptr<Communicator> replicate;  // ranks holding the same shard (same shard-group rank)
  int nodes = 1;                            // shard groups under hybrid sharding
  // The same shard and replicate groups over GPU memory (fsdp/device_collectives.h), for the FSDP
  // engine's gathers and gradient reductions when the model computes on a GPU; null for a group
  // of one rank (nothing to communicate) and on the CPU backend.
  std::unique_ptr<Communicator> shard_device, replicate_device;
  int shard_color = 0, replicate_color = 0;  // how world was split into them (MPI_Comm_split colours)
};

// Collective over world.comm. `ranks_per_node` (0: from the machine) must divide the world size;
// a bad value is a UserError naming the key.
ProcessGroups make_process_groups(const World& world, ShardingStrategy strategy, int64_t ranks_per_node);

}  // namespace fsdpq
