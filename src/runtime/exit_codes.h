// Process exit codes. Slurm scripts requeue on kExitCheckpointed; tests assert the others.
#pragma once

namespace fsdpq {
inline constexpr int kExitOk = 0;
inline constexpr int kExitInternalError = 1;  // a bug: please report it
inline constexpr int kExitUserError = 2;      // bad config, bad file, bad data: the message says which
inline constexpr int kExitCheckpointed = 75;  // preempted: checkpoint written, requeue me (EX_TEMPFAIL)
inline constexpr int kExitWatchdog = 76;      // a rank stalled: the job was stopped (runtime/watchdog.h)
}  // namespace fsdpq
