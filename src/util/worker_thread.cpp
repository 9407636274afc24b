#include "util/worker_thread.h"

#include <chrono>

namespace fsdpq {

WorkerThread::WorkerThread(std::function<void()> on_start)
    : thread_([this, start = std::move(on_start)]() mutable { run(std::move(start)); }) {}

WorkerThread::~WorkerThread() {
  {
    std::unique_lock lock(mutex_);
    progress_.wait(lock, [&] { return completed_ == posted_; });
    stopping_ = true;
  }
  work_.notify_all();
  thread_.join();
}

uint64_t WorkerThread::post(std::function<void()> job) {
  uint64_t ticket = 0;
  {
    std::lock_guard lock(mutex_);
    jobs_.push_back(std::move(job));
    ticket = ++posted_;
  }
  work_.notify_one();
  return ticket;
}

void WorkerThread::rethrow_error(std::unique_lock<std::mutex>&) {
  if (start_error_) std::rethrow_exception(start_error_);  // no job ever ran: say so at every wait
  if (error_) {
    std::exception_ptr e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

void WorkerThread::wait_for(uint64_t ticket) {
  std::unique_lock lock(mutex_);
  progress_.wait(lock, [&] { return completed_ >= ticket; });
  rethrow_error(lock);
}

void WorkerThread::drain() {
  std::unique_lock lock(mutex_);
  progress_.wait(lock, [&] { return completed_ == posted_; });
  rethrow_error(lock);
}

double WorkerThread::take_busy_seconds() {
  std::lock_guard lock(mutex_);
  const double s = busy_seconds_;
  busy_seconds_ = 0;
  return s;
}

void WorkerThread::run(std::function<void()> on_start) {
  std::exception_ptr start_error;
  if (on_start) {
    try {
      on_start();
    } catch (...) {
      start_error = std::current_exception();
    }
  }
  std::unique_lock lock(mutex_);
  start_error_ = start_error;
  for (;;) {
    work_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
    if (jobs_.empty()) return;  // stopping, nothing left
    std::function<void()> job = std::move(jobs_.front());
    jobs_.pop_front();
    lock.unlock();
    const auto begin = std::chrono::steady_clock::now();
    std::exception_ptr failed;
    if (!start_error) {
      try {
        job();
      } catch (...) {
        failed = std::current_exception();
      }
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
    lock.lock();
    busy_seconds_ += seconds;
    if (failed && !error_) error_ = failed;
    ++completed_;
    progress_.notify_all();
  }
}

}  // namespace fsdpq
