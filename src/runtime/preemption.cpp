#include "runtime/preemption.h"

#include <csignal>

namespace fsdpq {
namespace {

volatile std::sig_atomic_t g_signal = 0;

extern "C" void on_preemption_signal(int signal) {
  if (signal == SIGTERM && g_signal == SIGTERM) {  // asked twice: stop now
    std::signal(SIGTERM, SIG_DFL);
    std::raise(SIGTERM);
    return;
  }
  g_signal = signal;
}

}  // namespace

void install_preemption_handlers() {
  struct sigaction action {};
  action.sa_handler = on_preemption_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // reads and MPI calls in progress carry on
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGUSR1, &action, nullptr);
}

int preemption_signal() { return g_signal; }

const char* signal_name(int signal) {
  switch (signal) {
    case SIGTERM: return "SIGTERM";
    case SIGUSR1: return "SIGUSR1";
    default: return "a signal";
  }
}

}  // namespace fsdpq
