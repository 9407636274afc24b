#include "fsdp/sharding_strategy.h"

#include <algorithm>
#include <array>
#include <stdexcept>
#include <utility>

#include "util/error.h"

namespace fsdpq {
namespace {

constexpr std::array<std::pair<const char*, ShardingStrategy>, 5> kStrategies{{
    {"full_shard", ShardingStrategy::FullShard},
    {"shard_grad_op", ShardingStrategy::ShardGradOp},
    {"ddp", ShardingStrategy::Ddp},
    {"hybrid_full_shard", ShardingStrategy::HybridFullShard},
    {"hybrid_shard_grad_op", ShardingStrategy::HybridShardGradOp},
}};

}  // namespace

ShardingStrategy parse_sharding_strategy(const std::string& name) {
  for (const auto& [n, s] : kStrategies)
    if (name == n) return s;
  fail("sharding_strategy = '{}' is not a strategy: use full_shard, shard_grad_op, ddp, hybrid_full_shard or "
       "hybrid_shard_grad_op", name);
}

const char* sharding_strategy_name(ShardingStrategy strategy) {
  for (const auto& [n, s] : kStrategies)
    if (s == strategy) return n;
  return "?";
}

bool reshards_after_forward(ShardingStrategy strategy) {
  return strategy == ShardingStrategy::FullShard || strategy == ShardingStrategy::HybridFullShard;
}

bool is_hybrid(ShardingStrategy strategy) {
  return strategy == ShardingStrategy::HybridFullShard || strategy == ShardingStrategy::HybridShardGradOp;
}

int shard_group_size(ShardingStrategy strategy, int world, int ranks_per_node) {
  if (world < 1) throw std::logic_error("shard_group_size: world < 1");
  switch (strategy) {
    case ShardingStrategy::Ddp: return 1;
    case ShardingStrategy::FullShard:
    case ShardingStrategy::ShardGradOp: return world;
    case ShardingStrategy::HybridFullShard:
    case ShardingStrategy::HybridShardGradOp: return ranks_per_node > 0 ? std::min(ranks_per_node, world) : world;
  }
  throw std::logic_error("shard_group_size: unknown strategy");
}

}  // namespace fsdpq
