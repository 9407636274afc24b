#include "runtime/watchdog.h"

#include <mpi.h>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "runtime/exit_codes.h"

namespace fsdpq {
namespace {

using Clock = std::chrono::steady_clock;

int64_t now_ns() { return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count(); }
double seconds_since(int64_t ns) { return static_cast<double>(now_ns() - ns) * 1e-9; }

// What this rank is doing, published by the threads that do it, read by the watchdog thread.
struct RankState {
  std::atomic<const char*> wait_what{nullptr};
  std::atomic<const std::string*> wait_where{nullptr};
  std::atomic<int64_t> wait_since_ns{0};
  std::atomic<int64_t> progress_ns{now_ns()};
  std::atomic<const char*> phase{"starting"};
  std::atomic<int64_t> step{-1};
};
RankState g_state;
std::atomic<double> g_timeout_seconds{600.0};
thread_local int t_scope_depth = 0;

// Hooks and checks, by id.
std::mutex g_hooks_mutex;
int g_next_hook_id = 1;
std::map<int, std::function<void()>> g_abort_hooks;
std::map<int, std::function<std::optional<std::string>()>> g_health_checks;

// How long a peer's watchdog has to answer before its process counts as stopped.
constexpr double kAnswerSeconds = 10.0;
constexpr int kPingTag = 7301, kReportTag = 7302;

// What one rank's watchdog tells another's (sent as bytes: the ranks run the same binary).
struct PeerReport {
  uint32_t round = 0;
  int32_t rank = -1;
  int32_t waiting = 0;
  int32_t unused = 0;
  double wait_seconds = 0;
  double since_progress_seconds = 0;
  int64_t step = -1;
  char what[64] = {};
  char where[32] = {};
  char phase[64] = {};
  char host[64] = {};
};

void copy_text(char* out, size_t size, const char* text) {
  std::snprintf(out, size, "%s", text ? text : "");
}

PeerReport report_of(int rank, const std::string& host, uint32_t round) {
  PeerReport r;
  r.round = round;
  r.rank = rank;
  const char* what = g_state.wait_what.load();
  r.waiting = what != nullptr;
  if (what) {
    r.wait_seconds = seconds_since(g_state.wait_since_ns.load());
    copy_text(r.what, sizeof r.what, what);
    const std::string* where = g_state.wait_where.load();
    copy_text(r.where, sizeof r.where, where ? where->c_str() : "");
  }
  r.since_progress_seconds = seconds_since(g_state.progress_ns.load());
  r.step = g_state.step.load();
  copy_text(r.phase, sizeof r.phase, g_state.phase.load());
  copy_text(r.host, sizeof r.host, host.c_str());
  return r;
}

std::string describe_wait(const char* what, const char* where) {
  return where && *where ? fmt::format("{} on '{}'", what, where) : std::string(what);
}

std::string describe_work(const PeerReport& r) {
  return fmt::format("{}{} (last progress {:.0f} s ago)", r.phase, r.step >= 0 ? fmt::format(", step {}", r.step) : "",
                     r.since_progress_seconds);
}

class Watchdog {
 public:
  Watchdog(const World& world, bool ask_peers) : rank_(world.rank), size_(world.size), host_(world.hostname) {
    ask_peers_ = ask_peers && size_ > 1;
    if (ask_peers_) {
      MPI_Comm_dup(world.comm, &comm_);
      // Every rank's host, for naming a rank that cannot answer.
      char mine[64] = {};
      copy_text(mine, sizeof mine, host_.c_str());
      std::vector<char> all(64 * static_cast<size_t>(size_));
      MPI_Allgather(mine, 64, MPI_CHAR, all.data(), 64, MPI_CHAR, comm_);
      for (int r = 0; r < size_; ++r) hosts_.emplace_back(all.data() + 64 * r, strnlen(all.data() + 64 * r, 64));
      MPI_Irecv(&ping_round_, 1, MPI_UINT32_T, MPI_ANY_SOURCE, kPingTag, comm_, &ping_request_);
    }
    thread_ = std::thread([this] { run(); });
  }

  ~Watchdog() {
    stop_.store(true);
    thread_.join();
    if (!ask_peers_) return;
    MPI_Cancel(&ping_request_);
    MPI_Wait(&ping_request_, MPI_STATUS_IGNORE);
    for (MPI_Request& r : replies_) MPI_Wait(&r, MPI_STATUS_IGNORE);  // small: sent eagerly
  }

 private:
  void run() {
    int64_t last_health_ns = now_ns();
    while (!stop_.load()) {
      if (ask_peers_) serve_pings();
      check_wait();
      if (seconds_since(last_health_ns) >= 1.0) {
        check_health();
        last_health_ns = now_ns();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }

  // Answers every ping that arrived with this rank's report.
  void serve_pings() {
    for (;;) {
      int done = 0;
      MPI_Status status;
      MPI_Test(&ping_request_, &done, &status);
      if (!done) break;
      auto report = std::make_unique<PeerReport>(report_of(rank_, host_, ping_round_));
      replies_.emplace_back();
      MPI_Isend(report.get(), sizeof(PeerReport), MPI_BYTE, status.MPI_SOURCE, kReportTag, comm_, &replies_.back());
      reply_buffers_.push_back(std::move(report));
      MPI_Irecv(&ping_round_, 1, MPI_UINT32_T, MPI_ANY_SOURCE, kPingTag, comm_, &ping_request_);
    }
    // Forget the replies that went out.
    for (size_t i = 0; i < replies_.size();) {
      int done = 0;
      MPI_Test(&replies_[i], &done, MPI_STATUS_IGNORE);
      if (!done) {
        ++i;
        continue;
      }
      replies_.erase(replies_.begin() + static_cast<std::ptrdiff_t>(i));
      reply_buffers_.erase(reply_buffers_.begin() + static_cast<std::ptrdiff_t>(i));
    }
  }

  void check_wait() {
    const double timeout = g_timeout_seconds.load();
    const char* what = g_state.wait_what.load();
    if (timeout <= 0 || !what) return;
    const int64_t since = std::max(g_state.wait_since_ns.load(), extended_from_ns_);
    if (seconds_since(since) < timeout) return;
    const std::string* where = g_state.wait_where.load();
    const std::string mine = describe_wait(what, where ? where->c_str() : nullptr);
    const double waited = seconds_since(g_state.wait_since_ns.load());
    if (!ask_peers_) {
      end_job(fmt::format("fsdpq: rank {} ({}) has waited {:.0f} s in {} (collective_timeout_s = {:g}): a rank "
                          "has stopped (a stopped or frozen process, a hung GPU, a dead file system mount)",
                          rank_, host_, waited, mine, timeout));
    }
    diagnose(mine, waited, timeout);
  }

  // Asks every other rank's watchdog, then ends the job or, when a rank is still working and
  // making progress, waits longer.
  void diagnose(const std::string& mine, double waited, double timeout) {
    const std::vector<std::optional<PeerReport>> reports = ask_everyone(++round_);
    std::vector<std::string> silent, stuck, progressing;
    int lowest_waiting = rank_;
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      const auto& report = reports[static_cast<size_t>(r)];
      if (!report) {
        silent.push_back(fmt::format("rank {} ({}): did not answer within {:.0f} s: its process is stopped or "
                                     "frozen (SIGSTOP, swapping, a hung driver call or a dead file system mount)",
                                     r, hosts_[static_cast<size_t>(r)], kAnswerSeconds));
      } else if (report->waiting) {
        lowest_waiting = std::min(lowest_waiting, r);
      } else if (report->since_progress_seconds < timeout) {
        progressing.push_back(fmt::format("rank {} ({}): still working: {}", r, report->host, describe_work(*report)));
      } else {
        stuck.push_back(fmt::format("rank {} ({}): alive but stuck, not waiting for the others: {}", r, report->host,
                                    describe_work(*report)));
      }
    }
    if (silent.empty() && stuck.empty() && !progressing.empty()) {
      if (rank_ == lowest_waiting)
        std::fprintf(stderr, "fsdpq: rank %d has waited %.0f s in %s; waiting longer, since:\n  %s\n", rank_, waited,
                     mine.c_str(), fmt::format("{}", fmt::join(progressing, "\n  ")).c_str());
      extended_from_ns_ = now_ns();
      return;
    }
    std::vector<std::string> lines = silent;
    lines.insert(lines.end(), stuck.begin(), stuck.end());
    lines.insert(lines.end(), progressing.begin(), progressing.end());
    if (lines.empty())
      lines.push_back("every rank is waiting: they wait in different collectives, or on GPUs or a network that stalled");
    std::string message = fmt::format("fsdpq: rank {} ({}) has waited {:.0f} s in {} (collective_timeout_s = {:g})",
                                      rank_, host_, waited, mine, timeout);
    if (rank_ == lowest_waiting) message += fmt::format(":\n  {}", fmt::join(lines, "\n  "));
    end_job(message);
  }

  // Each other rank's report, or nullopt when it did not answer in time.
  std::vector<std::optional<PeerReport>> ask_everyone(uint32_t round) {
    std::vector<PeerReport> answers(static_cast<size_t>(size_));
    std::vector<MPI_Request> asks, answers_requests(static_cast<size_t>(size_), MPI_REQUEST_NULL);
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      MPI_Irecv(&answers[static_cast<size_t>(r)], sizeof(PeerReport), MPI_BYTE, r, kReportTag, comm_,
                &answers_requests[static_cast<size_t>(r)]);
      asks.emplace_back();
      MPI_Isend(&round, 1, MPI_UINT32_T, r, kPingTag, comm_, &asks.back());
    }
    std::vector<std::optional<PeerReport>> out(static_cast<size_t>(size_));
    const int64_t start = now_ns();
    int missing = size_ - 1;
    while (missing > 0 && seconds_since(start) < kAnswerSeconds) {
      serve_pings();  // the others may be asking this rank at the same time
      for (int r = 0; r < size_; ++r) {
        MPI_Request& request = answers_requests[static_cast<size_t>(r)];
        if (request == MPI_REQUEST_NULL) continue;
        int done = 0;
        MPI_Test(&request, &done, MPI_STATUS_IGNORE);
        if (!done) continue;
        out[static_cast<size_t>(r)] = answers[static_cast<size_t>(r)];
        --missing;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    for (MPI_Request& request : answers_requests)
      if (request != MPI_REQUEST_NULL) {
        MPI_Cancel(&request);
        MPI_Wait(&request, MPI_STATUS_IGNORE);
      }
    for (MPI_Request& request : asks) MPI_Request_free(&request);
    return out;
  }

  void check_health() {
    std::vector<std::function<std::optional<std::string>()>> checks;
    {
      std::lock_guard lock(g_hooks_mutex);
      for (const auto& [id, check] : g_health_checks) checks.push_back(check);
    }
    for (const auto& check : checks)
      if (std::optional<std::string> error = check())
        end_job(fmt::format("fsdpq: rank {} ({}): {}", rank_, host_, *error));
  }

  [[noreturn]] void end_job(const std::string& message) {
    std::fprintf(stderr, "%s\nfsdpq: stopping the job (exit code %d)\n", message.c_str(), kExitWatchdog);
    std::fflush(stderr);
    std::fflush(stdout);
    // The hooks (ncclCommAbort) release the GPU; they get a few seconds, not forever.
    std::vector<std::function<void()>> hooks;
    {
      std::lock_guard lock(g_hooks_mutex);
      for (const auto& [id, hook] : g_abort_hooks) hooks.push_back(hook);
    }
    auto done = std::make_shared<std::atomic<bool>>(false);
    std::thread([hooks, done] {
      for (const auto& hook : hooks) hook();
      done->store(true);
    }).detach();
    const int64_t start = now_ns();
    while (!done->load() && seconds_since(start) < 5.0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ::_exit(kExitWatchdog);
  }

  const int rank_, size_;
  const std::string host_;
  std::vector<std::string> hosts_;  // every rank's, when asking peers
  bool ask_peers_ = false;
  MPI_Comm comm_ = MPI_COMM_NULL;
  uint32_t ping_round_ = 0, round_ = 0;
  MPI_Request ping_request_ = MPI_REQUEST_NULL;
  std::vector<MPI_Request> replies_;
  std::vector<std::unique_ptr<PeerReport>> reply_buffers_;
  int64_t extended_from_ns_ = 0;  // a diagnosis found peers still working: the wait counts from here
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

std::unique_ptr<Watchdog> g_watchdog;

}  // namespace

void start_watchdog(const World& world, bool ask_peers) {
  if (!g_watchdog) g_watchdog = std::make_unique<Watchdog>(world, ask_peers);
}

void stop_watchdog() { g_watchdog.reset(); }

void set_watchdog_timeout(double seconds) { g_timeout_seconds.store(seconds); }
double watchdog_timeout() { return g_timeout_seconds.load(); }

WaitScope::WaitScope(const char* what, const std::string* where) : outermost_(t_scope_depth++ == 0) {
  if (!outermost_) return;
  g_state.wait_since_ns.store(now_ns());
  g_state.wait_where.store(where);
  g_state.wait_what.store(what);  // last: the watchdog reads a scope once `what` is set
}

WaitScope::~WaitScope() {
  --t_scope_depth;
  if (outermost_) g_state.wait_what.store(nullptr);
  watchdog_progress();  // a wait that ended is progress for the peers waiting on this rank
}

void watchdog_progress() { g_state.progress_ns.store(now_ns(), std::memory_order_relaxed); }

void watchdog_phase(const char* phase, int64_t step) {
  g_state.phase.store(phase);
  g_state.step.store(step);
  watchdog_progress();
}

int add_watchdog_abort_hook(std::function<void()> hook) {
  std::lock_guard lock(g_hooks_mutex);
  g_abort_hooks.emplace(g_next_hook_id, std::move(hook));
  return g_next_hook_id++;
}

int add_watchdog_health_check(std::function<std::optional<std::string>()> check) {
  std::lock_guard lock(g_hooks_mutex);
  g_health_checks.emplace(g_next_hook_id, std::move(check));
  return g_next_hook_id++;
}

void remove_watchdog_hook(int id) {
  std::lock_guard lock(g_hooks_mutex);
  g_abort_hooks.erase(id);
  g_health_checks.erase(id);
}

}  // namespace fsdpq
