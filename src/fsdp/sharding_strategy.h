// The `sharding_strategy` setting (fsdp/process_groups.h says what each does): its values, and the
// rules that follow from one alone, so that every part of fsdpq (groups, engine, planner) works
// them out in one place.
#pragma once
#include <string>

namespace fsdpq {

enum class ShardingStrategy { FullShard, ShardGradOp, Ddp, HybridFullShard, HybridShardGradOp };

// Throws UserError naming `sharding_strategy` and the allowed values.
ShardingStrategy parse_sharding_strategy(const std::string& name);
const char* sharding_strategy_name(ShardingStrategy strategy);
// full_shard and hybrid_full_shard free gathered parameters after each unit's forward (and gather
// again for backward); the shard_grad_op kinds keep them until the unit's backward is done.
bool reshards_after_forward(ShardingStrategy strategy);
// hybrid_full_shard and hybrid_shard_grad_op: shard within a node, replicate across nodes.
bool is_hybrid(ShardingStrategy strategy);
// The ranks a unit is sharded over, of `world` (ranks_per_node: a node's ranks, 0 for the
// machine's own under hybrid sharding, which is then taken as the whole world here).
int shard_group_size(ShardingStrategy strategy, int world, int ranks_per_node);

}  // namespace fsdpq
