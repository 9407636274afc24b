// Training checkpoints (docs/checkpoints.md): everything a run needs to continue exactly where it
// stopped — fp32 masters and optimizer state of every trainable tensor (written by the ranks that
// own each slice, readable at any world size), the step, epoch and position in the epoch's sample
// order, and the config and model shape it was made with, so an incompatible run is refused.
// Dropout masks and the sample order are functions of (seed, step, epoch): the position is their
// whole RNG state.
#pragma once
#include <filesystem>
#include <optional>

#include <nlohmann/json.hpp>

#include "app/run_plan.h"
#include "config/config_loader.h"
#include "dist/fsdp_engine.h"
#include "runtime/world.h"

namespace fsdpq {

struct TrainingPosition {
  int64_t step = 0;              // optimizer steps done
  int64_t epoch = 0;             // the epoch the next step belongs to
  int64_t samples_in_epoch = 0;  // samples of that epoch consumed, over all ranks
  double first_loss = 0;         // the run's first logged loss (for the summary)
  nlohmann::json loss_scaler;    // fp16_autocast: the dynamic loss scaler's state; null otherwise
};

// The checkpoint `resume` names: `auto` → the latest in checkpoint_dir (none: a fresh start);
// a path → that file (missing: UserError naming the key).
std::optional<std::filesystem::path> checkpoint_to_resume(const TrainConfig& config);

// Collective over the world. Writes checkpoint_dir/step-NNNNNNNN.h5 through a temporary name,
// then rank 0 points `latest` at it and prunes to keep_last. Returns the file.
std::filesystem::path save_training_checkpoint(const World& world, FsdpEngine& engine, const TrainingPosition& position,
                                               const ResolvedConfig& resolved, const RunPlan& plan);

// Collective over the world: verifies the file's checksums, refuses a checkpoint of another model,
// LoRA shape, optimizer, dataset, seed or global batch (UserError saying which and how they differ),
// loads every rank's slices into the engine and returns where to continue.
TrainingPosition load_training_checkpoint(const World& world, const std::filesystem::path& path, FsdpEngine& engine,
                                          const ResolvedConfig& resolved, const RunPlan& plan);

}  // namespace fsdpq
