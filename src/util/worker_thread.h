// One background thread running posted jobs in order: the CPU-offload engine accumulates and
// steps each unit's optimizer on it while the main thread queues the GPU's work on other units.
// A job that throws stops nothing else from being posted; its exception (the first one) is
// rethrown by the next wait.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace fsdpq {

class WorkerThread {
 public:
  // `on_start` runs first on the new thread (e.g. selecting its GPU).
  explicit WorkerThread(std::function<void()> on_start = {});
  ~WorkerThread();  // runs what is queued (dropping any error), then joins
  WorkerThread(const WorkerThread&) = delete;
  WorkerThread& operator=(const WorkerThread&) = delete;

  // Queues a job; returns its ticket (1, 2, 3 … in posting order).
  uint64_t post(std::function<void()> job);
  // Waits until the job with this ticket (and every one before it) has run; rethrows the first
  // exception a job threw since the last rethrow.
  void wait_for(uint64_t ticket);
  // Waits for every job posted so far.
  void drain();
  // Seconds the thread spent running jobs since the last take_busy_seconds().
  double take_busy_seconds();

 private:
  void run(std::function<void()> on_start);
  void rethrow_error(std::unique_lock<std::mutex>& lock);

  std::mutex mutex_;
  std::condition_variable work_, progress_;
  std::deque<std::function<void()>> jobs_;
  uint64_t posted_ = 0, completed_ = 0;
  bool stopping_ = false;
  std::exception_ptr error_, start_error_;
  double busy_seconds_ = 0;
  std::thread thread_;
};

}  // namespace fsdpq
