// The records of metrics.jsonl that describe the run rather than a step (docs/metrics.md): the
// header a run (or its continuation) starts with, and fsdp_qlora's memory readings.
#pragma once
#include <cstdint>

#include <nlohmann/json.hpp>

#include "app/run_plan.h"
#include "backend/tensor.h"
#include "config/config_loader.h"
#include "runtime/gpu.h"
#include "runtime/world.h"

namespace fsdpq {

// The run's settings, model, data, world and host: what analysis/ reads to describe a run.
nlohmann::json run_header(const ResolvedConfig& resolved, const RunPlan& plan, const World& world,
                          const GpuInfo& gpu, int64_t total_steps);

// fsdp_qlora's memory checkpoints: host memory, and on a GPU the allocator's numbers (this rank's).
nlohmann::json memory_record(const char* at, int64_t step, Device device);

}  // namespace fsdpq
