// Preemption notices: SIGTERM (scancel, a node draining) and SIGUSR1 (Slurm's `--signal=USR1@N`
// warning before the time limit) set a flag instead of killing the process; the trainer checks it
// (agreed across ranks) after each optimizer step, writes a checkpoint and exits with
// kExitCheckpointed so the batch script can requeue. A second SIGTERM kills as usual.
#pragma once

namespace fsdpq {

void install_preemption_handlers();
// The signal received (SIGTERM or SIGUSR1), or 0.
int preemption_signal();
const char* signal_name(int signal);

}  // namespace fsdpq
