#include "app/commands.h"
#include "app/run_plan.h"
#include "runtime/agreed_errors.h"
#include "runtime/exit_codes.h"
#include "runtime/fault_injection.h"
#include "runtime/gpu.h"
#include "runtime/log.h"
#include "train/trainer.h"
#include "util/error.h"

namespace fsdpq {

int run_training_job(const World& world, const ResolvedConfig& resolved) {
  GpuInfo gpu;
  run_on_all_ranks(world, [&] { gpu = select_gpu(world); });
  RunPlan plan = prepare_run(world, resolved);
  if (resolved.config.dry_run) {
    log::info("{}", format_dry_run(resolved, plan, world, gpu));
    // A failure on one rank from here on is not agreed: it must end the job (abort_job), not
    // leave the others waiting in the barrier below.
    maybe_inject_fault(world, "after_plan");
    MPI_Barrier(world.comm);
    log::info("dry run: everything checked, stopping before training (drop --dry_run to train)");
    return kExitOk;
  }
  TrainingOutcome outcome = train(world, resolved, plan, gpu);
  return outcome.preempted ? kExitCheckpointed : kExitOk;
}

}  // namespace fsdpq
