// One background thread running posted jobs in order: the CPU-offload engine steps each unit's
// optimizer on it while the main thread queues the GPU's backward of the remaining units.
// A job that throws stops nothing else from being posted; its exception (the first one) is
// rethrown by the next drain().
#pragma once
#include <condition_variable>
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
  ~WorkerThread();  // drains the queue (dropping any error), then joins
  WorkerThread(const WorkerThread&) = delete;
  WorkerThread& operator=(const WorkerThread&) = delete;

  void post(std::function<void()> job);
  // Waits until every posted job has run; rethrows the first exception a job threw since the
  // last drain.
  void drain();
  // Seconds the thread spent running jobs since the last take_busy_seconds().
  double take_busy_seconds();

 private:
  void run(std::function<void()> on_start);

  std::mutex mutex_;
  std::condition_variable work_, idle_;
  std::deque<std::function<void()>> jobs_;
  bool running_job_ = false, stopping_ = false;
  std::exception_ptr error_, start_error_;
  double busy_seconds_ = 0;
  std::thread thread_;
};

}  // namespace fsdpq
