// At start-up, a hint for a GPU run with memory to spare: with checkpointing on every layer and
// none kept, how many of the last layers keep_activation_layers could leave unrecomputed (each
// saves a layer's forward); otherwise, for a quantised base that keeps no dense layers, how many
// keep_dequantized_layers would fit (each saves a layer's dequantisation). Each within 90% of the
// card by the planner's GPU figure, with what it costs (docs/model.md). Memory for speed is the
// user's call (fsdp_qlora's default spends none), so it only says so.
#pragma once
#include <cstdint>

#include "app/run_plan.h"
#include "config/config_loader.h"
#include "plan/memory_plan.h"
#include "runtime/gpu.h"
#include "runtime/world.h"

namespace fsdpq {

inline constexpr double kKeptLayersHintShare = 0.9;  // of the GPU's memory, leaving room for others

// The kept dense layers the hint offers for `input` on a GPU of gpu_total_bytes: 0 unless the
// config keeps none on a quantised base and at least one fits.
int64_t kept_layers_to_suggest(const TrainConfig& c, const PlanInput& input, uint64_t gpu_total_bytes);

// The last layers the hint offers to leave unrecomputed (keep_activation_layers): 0 unless the
// config checkpoints every layer (checkpoint_every 1) and keeps none, and at least one fits.
int64_t activation_layers_to_suggest(const TrainConfig& c, const PlanInput& input, uint64_t gpu_total_bytes);

void hint_kept_dense_layers(const World& world, const ResolvedConfig& resolved, const RunPlan& plan, const GpuInfo& gpu);

}  // namespace fsdpq
