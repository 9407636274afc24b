// The training loop (fsdp_qlora's train loop): epochs of micro-batches on every rank, gradient
// accumulation, clipping, optimizer step, lr schedule, evaluation, metrics, progress, checkpoints
// and resume, and saving the result. Parameters, gradients and optimizer state are sharded by
// FSDP (src/fsdp/fsdp.h); a single rank is the same code with a shard group of one.
#pragma once
#include <optional>

#include "app/run_plan.h"
#include "config/config_loader.h"
#include "fsdp/collectives.h"
#include "model/llama_model.h"
#include "runtime/gpu.h"
#include "runtime/world.h"
#include "train/evaluation.h"  // evaluate_loss, for the eval command

namespace fsdpq {

struct TrainingOutcome {
  int64_t steps = 0;
  double first_loss = 0;
  double last_loss = 0;
  std::optional<double> eval_loss;  // at the end, when there is eval data
  double seconds = 0;
  bool preempted = false;  // stopped by SIGTERM/SIGUSR1 after writing a checkpoint
};

ModelOptions model_options_from(const TrainConfig& config);
// A preset's random weights are init-model's of this seed, so `preset:X` and the directory
// `fsdpq init-model --preset X` writes train identically.
inline constexpr uint64_t kPresetInitSeed = 0;
// The model of a plan: a preset's random weights (kPresetInitSeed) or an HF directory's.
// With `on_unit_built`, each unit is handed over as soon as it is built. `bytes_read`, when given,
// receives what was read of the model files (0 for a preset, which reads none).
LlamaModel build_model(const RunPlan& plan, const ModelOptions& options, const UnitBuiltCallback& on_unit_built = {},
                       uint64_t* bytes_read = nullptr);
// The same model, each unit built by `load_unit` (fsdp/shard_loader.h: a rank reads only its shards).
LlamaModel build_model(const RunPlan& plan, const ModelOptions& options, const UnitLoader& load_unit,
                       uint64_t* bytes_read = nullptr);

TrainingOutcome train(const World& world, const ResolvedConfig& resolved, RunPlan& plan, const GpuInfo& gpu);


}  // namespace fsdpq
