// The watchdog: no wait on another rank (a collective, a barrier, collective checkpoint I/O) or on
// this rank's GPU lasts forever. A stopped rank (SIGSTOP, a node swapping to death), a hung GPU or
// a dead file system mount used to hang the whole job until its time limit; now the ranks waiting
// for it notice after `collective_timeout_s` (default 10 minutes, like NCCL's and PyTorch's), say
// which rank stalled and where, and end the job with kExitWatchdog.
//
// Each rank runs one watchdog thread. Code that blocks on other ranks opens a WaitScope; the thread
// checks the open scope's age. When it expires, the thread asks every other rank's watchdog thread
// (over a communicator of its own; this needs MPI_THREAD_MULTIPLE, which fsdpq requests) what its
// rank is doing: waiting too, working (and whether it still makes progress: watchdog_progress()),
// or nothing at all — no answer within a few seconds means the process is stopped or frozen. A peer
// that still makes progress (a slow model load, a long checkpoint write) extends the wait; otherwise
// the thread prints the diagnosis, runs the abort hooks (ncclCommAbort on every NCCL communicator,
// so the GPU is released) and exits the process. The launcher (mpirun, srun --kill-on-bad-exit)
// then ends the job; without one, every waiting rank's own watchdog does.
//
// Health checks (NCCL's asynchronous errors: a peer's network failure) are polled every second and
// end the job the same way.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "runtime/world.h"

namespace fsdpq {

// Starts this process's watchdog thread (once MPI runs). `ask_peers`: MPI was initialised with
// MPI_THREAD_MULTIPLE, so the thread may talk to the other ranks' watchdogs. Collective.
void start_watchdog(const World& world, bool ask_peers);
// Stops and joins the thread (before MPI_Finalize). Safe when never started.
void stop_watchdog();
// collective_timeout_s; <= 0 disables the timeout (health checks go on).
void set_watchdog_timeout(double seconds);
double watchdog_timeout();

// This rank waits on other ranks (or its GPU) while a WaitScope lives. `what` and `where` must
// outlive the scope (string literals, a communicator's name): e.g. ("all-reduce", &comm.name()).
// Nested scopes: the outermost one's age counts.
class WaitScope {
 public:
  explicit WaitScope(const char* what, const std::string* where = nullptr);
  ~WaitScope();
  WaitScope(const WaitScope&) = delete;
  WaitScope& operator=(const WaitScope&) = delete;

 private:
  bool outermost_;
};

// This rank made progress (a unit loaded, a layer computed, a tensor written): a peer waiting for
// it keeps waiting while this keeps moving. Cheap: one relaxed atomic increment and a clock read.
void watchdog_progress();
// What this rank is doing, for a peer's diagnosis ("loading the model"); a string literal. `step`
// is the optimizer step it belongs to (-1: none).
void watchdog_phase(const char* phase, int64_t step = -1);

// Hooks the watchdog runs before it ends the process (ncclCommAbort). Returns an id for removal.
int add_watchdog_abort_hook(std::function<void()> hook);
// Polled every second: an error text ends the job (NCCL's asynchronous errors).
int add_watchdog_health_check(std::function<std::optional<std::string>()> check);
void remove_watchdog_hook(int id);

}  // namespace fsdpq
