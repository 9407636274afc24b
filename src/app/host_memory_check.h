// Before the model is loaded: will the run's host memory fit what this machine has left? The
// planner's host peak per rank (what `fsdpq plan` shows) for the ranks that share the memory,
// against MemAvailable and the cgroup limit (runtime/available_memory.h). A run that clearly does
// not fit is refused with the numbers and what to change; one that may not fit is warned about
// (docs/planner.md, "Host memory at start-up").
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "app/run_plan.h"
#include "runtime/available_memory.h"
#include "runtime/gpu.h"
#include "runtime/world.h"

namespace fsdpq {

// Refuse only when fsdpq's own host tensors exceed this multiple of what is available: the
// planner's figures are predictions (on the CPU backend the tensors alone stayed below the measured
// peak of TinyLlama-1.1B runs; the GPU host side is not measured yet), and the process beside them
// is an allowance (docs/planner.md, "Host memory at start-up").
inline constexpr double kHostRefuseAbove = 1.25;

struct HostMemoryDemand {
  int64_t tensors_per_rank = 0;  // what fsdpq allocates on the host per rank: the planner's peak less its allowance
  int64_t process_per_rank = 0;  // the planner's allowance for the process itself (binary, libraries, MPI)
  int64_t in_use_per_rank = 0;   // what a rank holds already (its private resident memory)
  int ranks = 1;                 // ranks drawing on the same memory
  std::string where;             // "on host n01" or "in cgroup /sys/fs/cgroup/…"
  // The tensors alone: allocated from here on, whatever the process already holds.
  int64_t certain() const { return ranks * tensors_per_rank; }
  // The tensors and what the process allowance still lacks beyond what the ranks hold.
  int64_t expected() const { return ranks * (tensors_per_rank + std::max<int64_t>(0, process_per_rank - in_use_per_rank)); }
};

enum class HostMemoryFit { Fits, MayNotFit, DoesNotFit };  // in rising order of trouble

// DoesNotFit when the certain part exceeds kHostRefuseAbove × available; MayNotFit when the
// expected part exceeds available.
HostMemoryFit judge_host_memory(const HostMemoryDemand& demand, int64_t available);

// The settings that lower this run's host memory, most effective first.
std::vector<std::string> ways_to_lower_host_memory(const TrainConfig& config, bool on_gpu, int shard_size,
                                                   int ranks_per_node);

// Collective. Logs the prediction; refuses (agreed by all ranks) a run that does not fit; warns,
// once per node, about one that may not. A dry run only warns: it may run elsewhere than the job.
void check_host_memory(const World& world, const ResolvedConfig& resolved, const RunPlan& plan, const GpuInfo& gpu);

}  // namespace fsdpq
