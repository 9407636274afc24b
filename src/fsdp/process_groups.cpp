#include "fsdp/process_groups.h"

#include <array>
#include <utility>

#include "util/error.h"

namespace fsdpq {
namespace {

// The node each rank belongs to for hybrid sharding.
int node_of(const World& world, int64_t ranks_per_node) {
  if (ranks_per_node <= 0) return world.node;
  return static_cast<int>(world.rank / ranks_per_node);
}

std::unique_ptr<Communicator> split(const World& world, int color, const char* name) {
  MPI_Comm sub;
  MPI_Comm_split(world.comm, color, world.rank, &sub);
  auto comm = make_mpi_communicator(sub, name);  // duplicates it
  MPI_Comm_free(&sub);
  return comm;
}

}  // namespace

ProcessGroups make_process_groups(const World& world, ShardingStrategy strategy, int64_t ranks_per_node) {
  ProcessGroups g;
  g.strategy = strategy;
  g.world = make_mpi_communicator(world.comm, "world");
  const bool hybrid = is_hybrid(strategy);
  if (ranks_per_node > 0 && world.size % ranks_per_node != 0)
    fail("ranks_per_node = {} does not divide the {} ranks of this job into whole nodes", ranks_per_node, world.size);
  if (hybrid && ranks_per_node <= 0 && world.num_nodes > 1 && world.size % world.num_nodes != 0)
    fail("hybrid sharding needs the same number of ranks on every node ({} ranks on {} nodes); set ranks_per_node",
         world.size, world.num_nodes);

  int shard_color = 0, replicate_color = world.rank;  // full_shard: one shard group, no replicas
  if (strategy == ShardingStrategy::Ddp) {
    shard_color = world.rank;
    replicate_color = 0;
  } else if (hybrid) {
    const int node = node_of(world, ranks_per_node);
    const int per_node = ranks_per_node > 0 ? static_cast<int>(ranks_per_node) : world.size / world.num_nodes;
    shard_color = node;
    replicate_color = ranks_per_node > 0 ? world.rank % per_node : world.local_rank;
    g.nodes = world.size / per_node;
  }
  g.shard_color = shard_color;
  g.replicate_color = replicate_color;
  g.shard = split(world, shard_color, "shard");
  g.replicate = split(world, replicate_color, "replicate");
  if (hybrid && g.shard->size() * g.replicate->size() != world.size)
    fail("hybrid sharding: nodes hold different numbers of ranks (shard group of {} × replica group of {} ≠ {} "
         "ranks); launch the same number of ranks per node or set ranks_per_node", g.shard->size(), g.replicate->size(), world.size);
  return g;
}

}  // namespace fsdpq
