#include "backend/side_stream.h"

#include <cstring>
#include <stdexcept>

#include "backend/cuda_backend.h"

#ifdef FSDPQ_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace fsdpq {

#ifdef FSDPQ_WITH_CUDA
namespace {

std::shared_ptr<void> record_event(cudaStream_t stream) {
  cudaEvent_t event = nullptr;
  cuda::check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "event create");
  std::shared_ptr<void> owned(event, [](void* e) { cudaEventDestroy(static_cast<cudaEvent_t>(e)); });
  cuda::check(cudaEventRecord(event, stream), "event record");
  return owned;
}

cudaEvent_t event_of(const std::shared_ptr<void>& e) { return static_cast<cudaEvent_t>(e.get()); }

}  // namespace

void StreamMark::host_wait() const {
  if (event_) cuda::check(cudaEventSynchronize(event_of(event_)), "event synchronize");
}

void StreamMark::compute_waits() const {
  if (!event_) return;
  cuda::check(cudaStreamWaitEvent(cuda::stream(), event_of(event_), 0), "stream wait (compute)");
  if (side_) cuda::compute_stream_joined(static_cast<cudaStream_t>(side_), side_releases_);
}

StreamMark mark_compute() {
  StreamMark m;
  if (cuda_initialized()) m.event_ = record_event(cuda::stream());
  return m;
}

SideStream::SideStream(Device device, StreamPriority priority) : device_(device) {
  if (device_ != Device::CUDA) return;
  int least = 0, greatest = 0;  // (greatest: the numerically smallest)
  cuda::check(cudaDeviceGetStreamPriorityRange(&least, &greatest), "stream priority range");
  cudaStream_t s = nullptr;
  cuda::check(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, priority == StreamPriority::High ? greatest : least),
              "side stream create");
  stream_ = s;
}

SideStream::~SideStream() {
  if (!stream_) return;
  cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));  // no copy may outlive its buffers' owner
  if (cublas_) cuda::cublas_api().destroy(cublas_);
  cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

void SideStream::wait(const StreamMark& mark) {
  if (stream_ && mark.event_)
    cuda::check(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream_), event_of(mark.event_), 0), "stream wait (side)");
}

void SideStream::copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (bytes == 0) return;
  if (!stream_) {
    if (dst_device != Device::CPU || src_device != Device::CPU)
      throw std::logic_error("SideStream: a CUDA pointer on a CPU side stream");
    std::memcpy(dst, src, bytes);
    return;
  }
  cuda::check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream_)), "side copy");
}

StreamMark SideStream::mark() {
  StreamMark m;
  if (!stream_) return m;
  m.side_releases_ = cuda::side_releases_so_far(static_cast<cudaStream_t>(stream_));
  m.event_ = record_event(static_cast<cudaStream_t>(stream_));
  m.side_ = stream_;
  return m;
}

OnSideStream::OnSideStream(SideStream& side) {
  if (!side.stream_) return;
  const cuda::Queue previous = cuda::redirect_queue({static_cast<cudaStream_t>(side.stream_), &side.cublas_});
  previous_stream_ = previous.stream;
  previous_cublas_ = previous.cublas;
  redirected_ = true;
}

OnSideStream::~OnSideStream() {
  if (redirected_) cuda::redirect_queue({static_cast<cudaStream_t>(previous_stream_), previous_cublas_});
}

std::function<void()> follow_current_gpu() {
  if (!cuda_initialized()) return [] {};
  const int device = cuda::device();
  return [device] { cuda::check(cudaSetDevice(device), "set device (worker thread)"); };
}

#else  // no CUDA: everything is immediate

void StreamMark::host_wait() const {}
void StreamMark::compute_waits() const {}
StreamMark mark_compute() { return {}; }

SideStream::SideStream(Device device, StreamPriority) : device_(device) {
  if (device == Device::CUDA) throw std::logic_error("SideStream: this fsdpq was built without CUDA");
}
SideStream::~SideStream() = default;
void SideStream::wait(const StreamMark&) {}
void SideStream::copy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (dst_device != Device::CPU || src_device != Device::CPU)
    throw std::logic_error("SideStream: a CUDA pointer in a build without CUDA");
  if (bytes) std::memcpy(dst, src, bytes);
}
StreamMark SideStream::mark() { return {}; }
OnSideStream::OnSideStream(SideStream&) {}
OnSideStream::~OnSideStream() = default;
std::function<void()> follow_current_gpu() { return [] {}; }

#endif

}  // namespace fsdpq
