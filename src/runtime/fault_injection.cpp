#include "runtime/fault_injection.h"

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>

#include "runtime/watchdog.h"
#include "util/strings.h"

namespace fsdpq {

void maybe_inject_fault(const World& world, std::string_view point) {
  const char* spec = std::getenv("FSDPQ_INJECT_FAULT");
  if (!spec || !*spec) return;
  auto parts = split(spec, ':');
  if (parts.size() != 2 && parts.size() != 3) return;
  const bool any_rank = parts[0] == "*";
  auto rank = parse_int(parts[0]);
  if (!(any_rank || (rank && *rank == world.rank)) || parts[1] != point) return;
  if (parts.size() == 3) {
    // kill: as the OOM killer or a node failure would (no unwinding, no flushing, no goodbye);
    // usr1 / term: the notices Slurm sends before preempting or at the time limit.
    if (parts[2] == "kill") std::raise(SIGKILL);
    if (parts[2] == "usr1") return void(std::raise(SIGUSR1));
    if (parts[2] == "term") return void(std::raise(SIGTERM));
    // stop: the whole process freezes (its watchdog too), as under SIGSTOP or a machine swapping;
    // hang: the caller blocks forever while the process lives (a hung driver call, a dead mount);
    // slow: 8 s of work that keeps reporting progress (a long but healthy load).
    if (parts[2] == "stop") return void(std::raise(SIGSTOP));
    if (parts[2] == "hang")
      for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
    if (parts[2] == "slow") {
      for (int i = 0; i < 80; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        watchdog_progress();
      }
      return;
    }
  }
  throw std::runtime_error("injected fault at " + std::string(point) + " (FSDPQ_INJECT_FAULT)");
}

}  // namespace fsdpq
