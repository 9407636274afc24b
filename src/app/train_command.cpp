#include "app/commands.h"
#include "runtime/exit_codes.h"
#include "runtime/log.h"
#include "util/error.h"

namespace fsdpq {
int run_training_job(const World& world, const ResolvedConfig& resolved) {
  log::info("{}", format_resolved_config(resolved));
  if (!resolved.config.dry_run) fail("training is not built yet");
  return kExitOk;
}
}  // namespace fsdpq
