#include "runtime/preemption.h"

#include <signal.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>

#include "runtime/exit_codes.h"

namespace fsdpq {
namespace {

volatile std::sig_atomic_t g_signal = 0;
volatile std::sig_atomic_t g_checkpointing = 0;  // training runs: a notice asks for a checkpoint
volatile std::sig_atomic_t g_rank = -1;

// The start-up message, composed once so the handler only write()s (async-signal-safe).
char g_startup_message[2][160];

void compose_messages() {
  const int signals[2] = {SIGTERM, SIGUSR1};
  for (int i = 0; i < 2; ++i) {
    const char* rank_text = "";
    char rank_buffer[32] = "";
    if (g_rank >= 0) {
      std::snprintf(rank_buffer, sizeof(rank_buffer), " (rank %d)", static_cast<int>(g_rank));
      rank_text = rank_buffer;
    }
    std::snprintf(g_startup_message[i], sizeof(g_startup_message[i]),
                  "fsdpq%s: %s received during start-up: nothing to checkpoint yet; exiting with code %d so the "
                  "job can be requeued\n",
                  rank_text, signal_name(signals[i]), kExitCheckpointed);
  }
}

extern "C" void on_preemption_signal(int signal) {
  if (!g_checkpointing) {
    const char* message = g_startup_message[signal == SIGUSR1 ? 1 : 0];
    size_t length = 0;
    while (message[length] != '\0') ++length;
    [[maybe_unused]] const ssize_t written = ::write(STDERR_FILENO, message, length);
    ::_exit(kExitCheckpointed);
  }
  if (signal == SIGTERM && g_signal == SIGTERM) {  // asked twice: stop now
    std::signal(SIGTERM, SIG_DFL);
    std::raise(SIGTERM);
    return;
  }
  g_signal = signal;
}

}  // namespace

void install_preemption_handlers() {
  compose_messages();
  struct sigaction action {};
  action.sa_handler = on_preemption_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // reads and MPI calls in progress carry on
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGUSR1, &action, nullptr);
}

void set_preemption_rank(int rank) {
  // Recomposed with the signals blocked, so the handler never reads a message half-written.
  sigset_t block, old;
  sigemptyset(&block);
  sigaddset(&block, SIGTERM);
  sigaddset(&block, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &block, &old);
  g_rank = rank;
  compose_messages();
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

void preemption_checkpoints_from_now() {
  g_checkpointing = 1;
  install_preemption_handlers();  // for callers that did not (tests driving train() directly)
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
