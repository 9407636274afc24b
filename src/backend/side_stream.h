// A second stream beside the compute stream (backend/cuda_backend.h), for host⇄device copies
// that overlap computation: the CPU-offload engine copies a unit's frozen weights in ahead of use,
// its gradients out and its updated parameters back in while the GPU computes other units.
//
// Ordering is explicit, with marks (CUDA events): work queued on a side stream after wait(m)
// starts only once everything before mark m is done; compute_waits(m) does the same for the
// compute stream, and host_wait(m) blocks the calling thread. The caching allocator is
// compute-stream ordered, so a side stream writing a freshly allocated block must first wait for
// the compute stream (wait_for_compute), and the compute stream must wait for a side stream's
// copy out of a block before that block is freed.
//
// Host memory a copy touches must be page-locked (HostStaging) for the copy to be asynchronous.
// On the CPU backend (and in a build without CUDA) a side stream copies at once with memcpy and
// every mark is already complete, so the same engine code runs, and is tested, on the CPU.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "backend/tensor.h"

struct cublasContext;  // (cublasHandle_t points to one)

namespace fsdpq {

// A point in a stream's work. A default-constructed mark is complete.
class StreamMark {
 public:
  StreamMark() = default;
  // Blocks the calling thread until the work before the mark is done (rethrows a CUDA error).
  void host_wait() const;
  // Work queued on the compute stream from now on waits for the mark.
  void compute_waits() const;
  bool complete() const { return event_ == nullptr; }

 private:
  friend class SideStream;
  friend StreamMark mark_compute();
  std::shared_ptr<void> event_;
  void* side_ = nullptr;             // a side stream's mark: its cudaStream_t,
  uint64_t side_releases_ = 0;       // and the blocks freed on it before the mark (cuda_backend.h)
};

// A mark at the end of the work queued on the compute stream so far (complete without a GPU).
StreamMark mark_compute();

// High: the GPU's block scheduler starts this stream's blocks before the compute stream's waiting
// ones, so short work beside a long product is not queued behind all of that product's blocks.
enum class StreamPriority { Normal, High };

class SideStream {
 public:
  // On Device::CUDA a stream of its own on the current GPU (cuda_init must have run); on
  // Device::CPU, immediate copies.
  explicit SideStream(Device device, StreamPriority priority = StreamPriority::Normal);
  ~SideStream();
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;

  void wait(const StreamMark& mark);
  void wait_for_compute() { wait(mark_compute()); }
  // Queues dst = src (bytes), either side on the host or the GPU.
  void copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);
  // A mark at the end of the work queued here so far.
  StreamMark mark();
  Device device() const { return device_; }

 private:
  friend class OnSideStream;
  Device device_;
  void* stream_ = nullptr;            // cudaStream_t
  cublasContext* cublas_ = nullptr;  // its cuBLAS handle, made by the first product queued here
};

// While alive, the kernels and memsets this thread queues (every op, and the section marks of
// backend/section_times.h) and cuBLAS products go to `side` instead of the compute stream, as
// PyTorch's `with torch.cuda.stream(s)` does.
// Ordering stays explicit: wait for the compute stream before touching what it uses, and have it
// wait for a mark before it reads the results. Nothing changes on the CPU backend.
class OnSideStream {
 public:
  explicit OnSideStream(SideStream& side);
  ~OnSideStream();
  OnSideStream(const OnSideStream&) = delete;
  OnSideStream& operator=(const OnSideStream&) = delete;

 private:
  void* previous_stream_ = nullptr;             // cudaStream_t
  cublasContext** previous_cublas_ = nullptr;  // its handle's slot
  bool redirected_ = false;
};

// A function that makes the calling thread's current GPU current on whichever thread runs it
// (a new thread starts on GPU 0, whatever cuda_init chose); it does nothing without a GPU.
std::function<void()> follow_current_gpu();

}  // namespace fsdpq
