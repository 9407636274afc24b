// What the FSDP parts tell of where a step's time went: totals per step (CommTimes, in the metrics)
// and, when profiling, each wait and job as it happens (EventSink, in the trace).
#pragma once
#include <chrono>
#include <functional>
#include <string>

namespace fsdpq {

// Seconds this rank spent blocked on communication since the last take_times(): waiting for
// parameter all-gathers (what prefetching did not hide) and reducing gradients; and copying
// between host and GPU when the shards' state lives on the host.
struct CommTimes {
  double gather_wait = 0;
  double reduce = 0;
  double offload_copies = 0;  // host⇄device copies of gradients and compute copies (state on the host)
  double host_worker = 0;     // the worker thread's accumulation and optimizer steps (overlapped)

  CommTimes& operator+=(const CommTimes& o) {
    gather_wait += o.gather_wait;
    reduce += o.reduce;
    offload_copies += o.offload_copies;
    host_worker += o.host_worker;
    return *this;
  }
};

// Profiling (profile = true): called with what ran ("gather wait", "reduce"; the CPU-offload
// worker's "host copy-out wait", "host accumulate", "host update", from the worker thread, so the
// sink must be thread-safe; and the main thread's waits on it, "update wait": a forward waiting
// for a unit's queued update, "norm wait": the gradient norm waiting for the last measurements),
// the unit's name ("layer 3") and when it ran.
using EventSink = std::function<void(const char* what, const std::string& unit,
                                     std::chrono::steady_clock::time_point begin,
                                     std::chrono::steady_clock::time_point end)>;

}  // namespace fsdpq
