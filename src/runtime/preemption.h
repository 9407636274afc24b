// Preemption notices: SIGTERM (scancel, a node draining) and SIGUSR1 (Slurm's `--signal=USR1@N`
// warning before the time limit). The handlers are installed first thing, so a notice never kills
// the process with 143 / 138, which Slurm scripts would not requeue:
//   - during start-up (config, data, model loading: there is nothing to checkpoint yet) the process
//     exits at once with kExitCheckpointed (75), and the requeued job starts over;
//   - once training runs (preemption_checkpoints_from_now), the notice only sets a flag; the
//     trainer checks it (agreed across ranks) after each optimizer step, writes a checkpoint and
//     exits with kExitCheckpointed.
// A second SIGTERM kills as usual.
#pragma once

namespace fsdpq {

void install_preemption_handlers();
// This process's rank, for the start-up message (before it is set: none is named).
void set_preemption_rank(int rank);
// From now on a notice is answered with a checkpoint after the current step.
void preemption_checkpoints_from_now();
// The signal received (SIGTERM or SIGUSR1), or 0.
int preemption_signal();
const char* signal_name(int signal);

}  // namespace fsdpq
