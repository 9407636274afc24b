// Training checkpoints (docs/checkpoints.md): everything a run needs to continue exactly where it
// stopped — fp32 masters and optimizer state of every trainable tensor (written by the ranks that
// own each slice, readable at any world size), the step, epoch and position in the epoch's sample
// order, and the config and model shape it was made with, so an incompatible run is refused.
// Dropout masks and the sample order are functions of (seed, step, epoch): the position is their
// whole RNG state.
#pragma once
#include <cmath>
#include <filesystem>
#include <optional>

#include <nlohmann/json.hpp>

#include "app/run_plan.h"
#include "config/config_loader.h"
#include "fsdp/fsdp.h"
#include "runtime/world.h"

namespace fsdpq {

struct TrainingPosition {
  int64_t step = 0;              // optimizer steps done
  int64_t epoch = 0;             // the epoch the next step belongs to
  int64_t samples_in_epoch = 0;  // samples of that epoch consumed, over all ranks
  double first_loss = 0;         // the run's first logged loss (for the summary)
  double last_loss = std::nan("");  // the loss of step `step` (NaN: not known, e.g. before step 1)
  nlohmann::json loss_scaler;    // fp16_autocast: the dynamic loss scaler's state; null otherwise
};

// The checkpoint `resume` names: `auto` → the latest in checkpoint_dir (none: a fresh start);
// a path → that file (missing: UserError naming the key).
std::optional<std::filesystem::path> checkpoint_to_resume(const TrainConfig& config);

// This run's base fingerprint (train/base_fingerprint.h): computed on rank 0, the same JSON on
// every rank. Collective; errors are agreed.
nlohmann::json run_base_fingerprint(const World& world, const RunPlan& plan);

// Collective over the world. Writes checkpoint_dir/step-NNNNNNNN.h5 through a temporary name,
// then rank 0 points `latest` at it and prunes to keep_last. Returns the file. `fingerprint` is
// run_base_fingerprint's.
std::filesystem::path save_training_checkpoint(const World& world, Fsdp& fsdp, const TrainingPosition& position,
                                               const ResolvedConfig& resolved, const RunPlan& plan,
                                               const nlohmann::json& fingerprint);

// Collective over the world: verifies the file's checksums and refuses a checkpoint of another
// model shape, LoRA shape, optimizer, dataset, seed or global batch, or (unless resume_ignore_model)
// of other base weights or another tokenizer: UserError saying which and how they differ. What a
// dry run checks; load_training_checkpoint checks the same first.
void check_training_checkpoint(const World& world, const std::filesystem::path& path, const ResolvedConfig& resolved,
                               const RunPlan& plan, const nlohmann::json& fingerprint);

// check_training_checkpoint, then loads every rank's slices into the training state and returns where to continue.
TrainingPosition load_training_checkpoint(const World& world, const std::filesystem::path& path, Fsdp& fsdp,
                                          const ResolvedConfig& resolved, const RunPlan& plan,
                                          const nlohmann::json& fingerprint);

}  // namespace fsdpq
