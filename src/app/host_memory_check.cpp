#include "app/host_memory_check.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <optional>

#include "plan/memory_plan.h"
#include "runtime/agreed_errors.h"
#include "runtime/host_memory.h"
#include "runtime/log.h"
#include "util/error.h"
#include "util/strings.h"

namespace fsdpq {
namespace {

// GiB with two decimals, as `fsdpq plan` prints them.
std::string gib(int64_t bytes) { return fmt::format("{:.2f} GiB", static_cast<double>(bytes) / (1024.0 * 1024 * 1024)); }

// How many ranks hold the same `key` (e.g. host and cgroup). Collective.
int ranks_with_key(const World& world, const std::string& key) {
  const uint64_t mine = std::hash<std::string>{}(key);
  std::vector<uint64_t> all(static_cast<size_t>(world.size));
  MPI_Allgather(&mine, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, world.comm);
  return static_cast<int>(std::count(all.begin(), all.end(), mine));
}

struct Judged {
  HostMemoryDemand demand;
  int64_t available = 0;
  HostMemoryFit fit = HostMemoryFit::Fits;
};

std::string explain(const Judged& j, const AvailableMemory& available, const ResolvedConfig& resolved,
                    const std::vector<std::string>& ways) {
  const HostMemoryDemand& d = j.demand;
  const std::string how_much =
      j.fit == HostMemoryFit::DoesNotFit
          ? fmt::format("will allocate {} of host memory for the model, its optimizer state and buffers ({} × {} per "
                        "rank: `fsdpq plan`'s host peak per rank, {}, less its {} allowance for the process)",
                        gib(d.certain()), d.ranks, gib(d.tensors_per_rank), gib(d.tensors_per_rank + d.process_per_rank),
                        gib(d.process_per_rank))
          : fmt::format("need about {} more host memory ({} × {} host peak per rank as `fsdpq plan` predicts it, less "
                        "{} each already holds)",
                        gib(d.expected()), d.ranks, gib(d.tensors_per_rank + d.process_per_rank), gib(d.in_use_per_rank));
  return fmt::format(
      "host memory: the {} rank(s) of this run {} {}, but {} is available there ({}): the run {} out of memory "
      "while loading the model or training. To need less: {}. `fsdpq plan {} --host-mem GiB` shows where the host "
      "memory goes",
      d.ranks, d.where, how_much, gib(j.available), available.sources(),
      j.fit == HostMemoryFit::DoesNotFit ? "would run" : "may run", join(ways, "; "),
      resolved.config_path.empty() ? "CONFIG.ini" : resolved.config_path);
}

}  // namespace

HostMemoryFit judge_host_memory(const HostMemoryDemand& demand, int64_t available) {
  if (static_cast<double>(demand.certain()) > kHostRefuseAbove * static_cast<double>(available))
    return HostMemoryFit::DoesNotFit;
  if (demand.expected() > available) return HostMemoryFit::MayNotFit;
  return HostMemoryFit::Fits;
}

std::vector<std::string> ways_to_lower_host_memory(const TrainConfig& c, bool on_gpu, int shard_size,
                                                   int ranks_per_node) {
  std::vector<std::string> ways;
  if (on_gpu && c.use_cpu_offload)
    ways.push_back("use_cpu_offload = false (the weights and optimizer state then stay on the GPU)");
  if (c.use_activation_cpu_offload) ways.push_back("use_activation_cpu_offload = false");
  if (c.is_lora() && !c.quantized_base()) ways.push_back("train_type = qlora (the frozen weights in 4-bit NF4)");
  if (!on_gpu) ways.push_back("a smaller batch_size or context_length (the CPU backend keeps the activations in host memory)");
  if (shard_size == 1 && ranks_per_node > 1)
    ways.push_back("sharding_strategy = full_shard (each rank then holds a shard of the model, not all of it)");
  if (ranks_per_node > 1) ways.push_back("fewer ranks per node (the same ranks over more nodes)");
  ways.push_back("more memory for the job (a larger cgroup or Slurm --mem limit, or a larger node)");
  return ways;
}

void check_host_memory(const World& world, const ResolvedConfig& resolved, const RunPlan& plan, const GpuInfo& gpu) {
  const TrainConfig& c = resolved.config;
  const AvailableMemory available = read_available_memory(host_root());
  const int in_cgroup =
      ranks_with_key(world, world.hostname + "\n" + (available.cgroup ? available.cgroup->dir.string() : ""));

  PlanInput input = plan_input_from(c, plan.model.config, world.size);
  input.on_gpu = gpu.has_gpu();
  const MemoryPrediction predicted = predict_memory(input);
  HostMemoryDemand per_rank;
  per_rank.tensors_per_rank = predicted.host_per_rank - kHostProcessBytes;
  per_rank.process_per_rank = kHostProcessBytes;
  per_rank.in_use_per_rank = host_memory().private_now;
  std::vector<Judged> judged;
  auto add = [&](int ranks, const std::string& where, int64_t bytes) {
    HostMemoryDemand demand = per_rank;
    demand.ranks = ranks;
    demand.where = where;
    judged.push_back({demand, bytes, judge_host_memory(demand, bytes)});
  };
  if (available.mem_available) add(world.local_size, "on host " + world.hostname, *available.mem_available);
  if (available.cgroup) add(in_cgroup, "in cgroup " + available.cgroup->dir.string(), available.cgroup->available());
  // The constraint that fits worst speaks: DoesNotFit, then MayNotFit, then the one with least room.
  const auto worst = std::max_element(judged.begin(), judged.end(), [](const Judged& a, const Judged& b) {
    return a.fit != b.fit ? a.fit < b.fit : a.available - a.demand.expected() > b.available - b.demand.expected();
  });

  if (worst == judged.end()) {
    log::info("host memory: not checked ({}); the run's host peak per rank is predicted at {}", available.describe(),
              gib(predicted.host_per_rank));
    return;
  }
  log::info("host memory: {} rank(s) {} × {} predicted host peak per rank, less {} each already holds: about {} "
            "still to allocate; available {}",
            worst->demand.ranks, worst->demand.where, gib(predicted.host_per_rank), gib(per_rank.in_use_per_rank),
            gib(worst->demand.expected()), available.describe());
  const std::string message = explain(
      *worst, available, resolved, ways_to_lower_host_memory(c, gpu.has_gpu(), predicted.shard_size, world.local_size));
  const bool refuse = worst->fit == HostMemoryFit::DoesNotFit && !c.dry_run;
  run_on_all_ranks(world, [&] {
    if (refuse) fail("{}", message);
  });
  if (worst->fit != HostMemoryFit::Fits && world.local_rank == 0)
    log::write(stderr, fmt::format("warning: {}{}\n", message,
                                   c.dry_run ? " (a dry run only warns: the job may run on other machines)" : ""));
}

}  // namespace fsdpq
