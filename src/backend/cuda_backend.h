// The CUDA backend's process-wide state: the GPU this rank drives, its compute stream, the cuBLAS
// handle, and the caching allocator behind every CUDA Tensor. Ops on CUDA tensors run on the one
// compute stream, so they are ordered without events and a freed block can be reused by the next
// op at once (PyTorch's rule for a single stream); ops a side stream runs (backend/side_stream.h)
// have their freed blocks held back until the compute stream is ordered after them. Copies to the
// host wait for the stream; nothing else synchronises.
//
// The functions without a cuda:: prefix exist in every build: without CUDA (or without a GPU)
// cuda_device_count() is 0 and cuda_init() throws a UserError saying why.
#pragma once
#include <cstddef>
#include <cstdint>

#include "backend/caching_allocator.h"
#include "backend/tensor.h"

namespace fsdpq {

// GPUs this process can use: 0 when built without CUDA, without a driver, or without a device.
int cuda_device_count();
// Makes `device` current, creates the stream, the cuBLAS handle and the allocator, and installs
// Tensor's CUDA memory hooks. Calling it again with the same device does nothing.
void cuda_init(int device);
bool cuda_initialized();
// Waits for everything queued on the compute stream; throws if a kernel failed.
void cuda_synchronize();
MemoryStats cuda_memory_stats();
void cuda_reset_peak_memory();
void cuda_empty_cache();

// What a CUDA-only function (a device optimizer, a device gradient pass) does when called in a build
// without CUDA, where no CUDA tensor can exist: throws std::logic_error("<what>: this fsdpq was
// built without CUDA"). The ops need no such branch: runs_on_cuda (ops/dispatch.h) stops a CUDA
// operand before an op reaches its CUDA implementation.
[[noreturn]] void no_cuda(const char* what);

// The compute stream as an opaque handle (a cudaStream_t), for libraries that order work after
// it (NCCL); nullptr before cuda_init or without CUDA.
void* cuda_compute_stream();

// dst = src byte for byte (the same dtype and element count), between any two devices. A copy
// into host memory returns when the bytes are there; other copies are queued on the stream.
void copy_tensor(TensorView dst, const TensorView& src);
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);
// A copy of src on `device` (the same dtype and shape).
Tensor copy_to(const TensorView& src, Device device);

// A reusable host buffer for host⇄GPU copies. Once the CUDA backend runs it is page-locked
// (cudaHostAlloc): copies from pageable memory ran at ~1.8 GB/s in a 640 MB gradient copy on
// the H200 machine, where pinned memory moves ~55 GB/s. Without CUDA it is ordinary memory. It
// grows to the largest request and keeps that size.
class HostStaging {
 public:
  HostStaging() = default;
  ~HostStaging();
  HostStaging(const HostStaging&) = delete;
  HostStaging& operator=(const HostStaging&) = delete;
  // At least `bytes` of memory (contents not kept when it grows).
  void* reserve(size_t bytes);

 private:
  void release();
  void* data_ = nullptr;
  size_t size_ = 0;
  bool pinned_ = false;
};

}  // namespace fsdpq

#ifdef FSDPQ_WITH_CUDA
#include <cublas_v2.h>
#include <cuda_runtime.h>

namespace fsdpq::cuda {

// Where this thread's work goes: a stream, and the slot of the cuBLAS handle bound to it (a side
// stream's own, made on first use: cuBLAS's workspace belongs to its handle, so two streams
// running products at once must not share one).
struct Queue {
  cudaStream_t stream = nullptr;  // nullptr: the compute stream
  cublasHandle_t* cublas = nullptr;
};
// The stream this thread queues work to: the compute stream (cuda_init must have run), or a side
// stream while an OnSideStream (backend/side_stream.h) redirects this thread's work.
cudaStream_t stream();
// Redirects this thread's kernels, memsets and cuBLAS products to `to` ({}: back to the compute
// stream) and returns the previous redirection; OnSideStream is its one user.
Queue redirect_queue(Queue to);
// Blocks freed while work went to a side stream return to the caching allocator's pool (which
// is the compute stream's) once that stream has passed their release, or once the compute stream
// waits for a mark of it taken after it (backend/cuda_backend.cpp). How many `side` has had so
// far, and: the calling thread's stream now waits for `side` as it was at `releases` of them.
uint64_t side_releases_so_far(cudaStream_t side);
void compute_stream_joined(cudaStream_t side, uint64_t releases);
// The cuBLAS handle bound to stream(): the compute stream's, or the side stream's (made here the
// first time, with the compute handle's math mode).
cublasHandle_t cublas();

// cuBLAS is opened by cuda_init (dlopen), not linked: loading it costs ~200 MiB of resident
// memory per process, which CPU ranks and the tools that never touch a GPU should not pay.
struct CublasApi {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasDestroy_v2) destroy = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  // cublasGemmEx's C signature (C++ also sees a deprecated overload, so no decltype).
  using GemmEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                                    const void*, cudaDataType, int, const void*, cudaDataType, int, const void*,
                                    void*, cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
  GemmEx gemm_ex = nullptr;
  decltype(&cublasGetStatusString) status_string = nullptr;
  decltype(&cublasSetMathMode) set_math_mode = nullptr;
  decltype(&cublasGetMathMode) get_math_mode = nullptr;
};
const CublasApi& cublas_api();
int device();
// Throw std::runtime_error("CUDA <what>: <error>") on failure.
void check(cudaError_t err, const char* what);
void check_cublas(cublasStatus_t status, const char* what);

}  // namespace fsdpq::cuda
#endif
