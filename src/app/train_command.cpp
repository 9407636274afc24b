#include <filesystem>
#include <vector>

#include "app/commands.h"
#include "app/host_memory_check.h"
#include "app/kept_layers_hint.h"
#include "app/run_plan.h"
#include "runtime/agreed_errors.h"
#include "runtime/exit_codes.h"
#include "runtime/fault_injection.h"
#include "runtime/gpu.h"
#include "runtime/log.h"
#include "runtime/watchdog.h"
#include "train/run_directory.h"
#include "train/train_checkpoint.h"
#include "train/trainer.h"
#include "util/error.h"

namespace fsdpq {
namespace {

namespace fs = std::filesystem;

// Whether `dir` is `root` or lies below it (both may not exist yet).
bool is_within(const fs::path& dir, const fs::path& root) {
  const fs::path relative = fs::weakly_canonical(fs::absolute(dir)).lexically_relative(fs::weakly_canonical(fs::absolute(root)));
  return !relative.empty() && *relative.begin() != "..";
}

// Rank 0 claims output_dir (and checkpoint_dir when it lies elsewhere) for the run's life, proves
// both writable, and refuses a fresh run into directories that hold a previous run's results
// unless `overwrite` (then they are removed; a dry run only says so). Collective; the locks are
// released when the returned objects go (or the process ends).
std::vector<DirectoryLock> claim_run_directories(const World& world, const ResolvedConfig& resolved) {
  const TrainConfig& c = resolved.config;
  std::vector<DirectoryLock> locks;
  // A dry run creates no directory: it checks that it could, and claims those that exist.
  auto claim = [&](const fs::path& dir, const std::string& key, bool lock) {
    std::error_code ec;
    if (c.dry_run && !fs::exists(dir, ec)) return check_creatable_directory(dir, key);
    if (lock) locks.push_back(DirectoryLock::acquire(dir, key));
    check_writable_directory(dir, key);
  };
  run_on_all_ranks(world, [&] {
    if (!world.is_root()) return;
    claim(c.output_dir, "output_dir", true);
    claim(c.checkpoint_dir, "checkpoint_dir", !is_within(c.checkpoint_dir, c.output_dir));
    if (!c.resume.empty()) return;  // continuing: the previous run's files are this run's
    const PreviousRun previous = find_previous_run(c.output_dir, c.checkpoint_dir);
    if (previous.empty()) return;
    if (!c.overwrite)
      fail("output_dir '{}' holds a previous run ({}): `--resume auto` continues it, `--overwrite true` replaces it, "
           "or choose another output_dir",
           c.output_dir, previous.describe());
    if (c.dry_run) {
      log::info("overwrite = true: the run would remove the previous run's files ({}: {} file(s))", previous.describe(),
                previous.files.size());
      return;
    }
    remove_previous_run(previous);
    log::info("overwrite = true: removed the previous run's files ({}: {} file(s))", previous.describe(),
              previous.files.size());
  });
  for (const DirectoryLock& lock : locks)
    if (!lock.warning().empty()) log::warn("{}", lock.warning());
  return locks;
}

// The dry run's part of resuming: the checkpoint the run would continue, checked as the run would
// check it (before loading it).
void check_resume(const World& world, const ResolvedConfig& resolved, const RunPlan& plan) {
  std::optional<fs::path> checkpoint;
  run_on_all_ranks(world, [&] { checkpoint = checkpoint_to_resume(resolved.config); });
  if (!checkpoint) {
    if (!resolved.config.resume.empty())
      log::info("resume = auto: no checkpoint in {} yet; the run would start from step 0", resolved.config.checkpoint_dir);
    return;
  }
  const nlohmann::json fingerprint = run_base_fingerprint(world, plan);
  run_on_all_ranks(world, [&] { check_training_checkpoint(world, *checkpoint, resolved, plan, fingerprint); });
  log::info("resume: {} can continue this run", checkpoint->string());
}

}  // namespace

int run_training_job(const World& world, const ResolvedConfig& resolved) {
  GpuInfo gpu;
  run_on_all_ranks(world, [&] { gpu = select_gpu(world); });
  // Claimed before the slow preparation, so that a second run into the same directories stops at once.
  const std::vector<DirectoryLock> claimed = claim_run_directories(world, resolved);
  RunPlan plan = prepare_run(world, resolved);
  // Before the model is loaded: a run that cannot fit in host memory stops here, with the numbers.
  check_host_memory(world, resolved, plan, gpu);
  hint_kept_dense_layers(world, resolved, plan, gpu);
  if (resolved.config.dry_run) {
    log::info("{}", format_dry_run(resolved, plan, world, gpu));
    check_resume(world, resolved, plan);
    // A failure on one rank from here on is not agreed: it must end the job (abort_job), not
    // leave the others waiting in the barrier below.
    maybe_inject_fault(world, "after_plan");
    {
      const WaitScope waiting("the dry run's final barrier");
      MPI_Barrier(world.comm);
    }
    log::info("dry run: everything checked, stopping before training (drop --dry_run to train)");
    return kExitOk;
  }
  TrainingOutcome outcome = train(world, resolved, plan, gpu);
  return outcome.preempted ? kExitCheckpointed : kExitOk;
}

}  // namespace fsdpq
