// The training loop (fsdp_qlora's train loop, single rank for now): epochs of micro-batches,
// gradient accumulation, clipping, optimizer step, lr schedule, evaluation, metrics, progress,
// and saving the result. Sharding across ranks wraps around this in the sharding issue.
#pragma once
#include <optional>

#include "app/run_plan.h"
#include "config/config_loader.h"
#include "model/llama_model.h"
#include "runtime/gpu.h"
#include "runtime/world.h"

namespace fsdpq {

struct TrainingOutcome {
  int64_t steps = 0;
  double first_loss = 0;
  double last_loss = 0;
  std::optional<double> eval_loss;  // at the end, when there is eval data
  double seconds = 0;
};

ModelOptions model_options_from(const TrainConfig& config);
// The model of a plan: a preset's random weights (init-model's seed 0, so `preset:X` and the
// directory `fsdpq init-model --preset X` writes train identically) or an HF directory's.
LlamaModel build_model(const RunPlan& plan, const ModelOptions& options);

TrainingOutcome train(const World& world, const ResolvedConfig& resolved, RunPlan& plan, const GpuInfo& gpu);

// Token-weighted mean loss over `examples` (evaluation: no dropout, no gradients).
double evaluate_loss(LlamaModel& model, const std::vector<data::Example>& examples, int64_t batch_size,
                     int32_t pad_id, int64_t context_length);

}  // namespace fsdpq
