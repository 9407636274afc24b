#include "backend/cuda_backend.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "runtime/watchdog.h"
#include "runtime/host_out_of_memory.h"
#include "util/error.h"

#ifdef FSDPQ_WITH_CUDA
#include <dlfcn.h>

#include "kernels/kernel_types.cuh"
#endif

namespace fsdpq {

#ifdef FSDPQ_WITH_CUDA
namespace cuda {
namespace {

CublasApi load_cublas() {
  void* library = nullptr;
  std::string tried;
  for (const char* name : {"libcublas.so.13", "libcublas.so", "/usr/local/cuda/lib64/libcublas.so.13"}) {
    library = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (library) break;
    tried += fmt::format("\n  {}: {}", name, dlerror());
  }
  if (!library) throw UserError("cannot load cuBLAS (the CUDA 13 libcublas.so.13; add its folder to LD_LIBRARY_PATH):" + tried);
  CublasApi api;
  auto symbol = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(library, name));
    if (!fn) throw UserError(fmt::format("cuBLAS library has no {}", name));
  };
  symbol(api.create, "cublasCreate_v2");
  symbol(api.set_stream, "cublasSetStream_v2");
  symbol(api.gemm_ex, "cublasGemmEx");
  symbol(api.status_string, "cublasGetStatusString");
  symbol(api.set_math_mode, "cublasSetMathMode");
  symbol(api.get_math_mode, "cublasGetMathMode");
  return api;
}

CublasApi& cublas_functions() {
  static CublasApi api;
  return api;
}

struct Backend {
  int device = -1;
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  std::unique_ptr<CachingAllocator> allocator;
};

Backend& backend() {
  static Backend state;
  return state;
}

Backend& ready() {
  Backend& b = backend();
  if (b.device < 0) throw std::logic_error("the CUDA backend is used before cuda_init()");
  return b;
}

void* raw_allocate(size_t bytes) {
  void* p = nullptr;
  if (cudaMalloc(&p, bytes) != cudaSuccess) {
    cudaGetLastError();  // out of memory is not sticky; clear it so the retry can succeed
    return nullptr;
  }
  return p;
}

void raw_release(void* p) { cudaFree(p); }

void* hook_allocate(size_t bytes) { return ready().allocator->allocate(bytes); }
void hook_release(void* p) {
  Backend& b = backend();
  if (b.allocator) b.allocator->release(p);  // at exit the backend may be gone already
}
void hook_fill_zero(void* p, size_t bytes) { check(cudaMemsetAsync(p, 0, bytes, stream()), "memset"); }

}  // namespace

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw std::runtime_error(fmt::format("CUDA {}: {}", what, cudaGetErrorString(err)));
}

void check_cublas(cublasStatus_t status, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  const auto describe = cublas_functions().status_string;
  throw std::runtime_error(fmt::format("cuBLAS {}: {}", what, describe ? describe(status) : std::to_string(status)));
}

const CublasApi& cublas_api() {
  if (!cublas_functions().gemm_ex) throw std::logic_error("cuBLAS is used before cuda_init()");
  return cublas_functions();
}

void check_launch(const char* kernel) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw std::runtime_error(fmt::format("CUDA kernel {}: {}", kernel, cudaGetErrorString(err)));
}

namespace {
// OnSideStream's redirection of this thread's queued work (nullptr: the compute stream).
thread_local cudaStream_t queue_override = nullptr;
}  // namespace

cudaStream_t stream() { return queue_override ? queue_override : ready().stream; }
cudaStream_t redirect_queue(cudaStream_t to) {
  const cudaStream_t previous = queue_override;
  queue_override = to;
  return previous;
}
cublasHandle_t cublas() {
  // The one cuBLAS handle is bound to the compute stream, and other threads may use it.
  if (queue_override) throw std::logic_error("cuBLAS is called while work is redirected to a side stream");
  return ready().cublas;
}
int device() { return ready().device; }

}  // namespace cuda

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

void cuda_init(int device) {
  cuda::Backend& b = cuda::backend();
  if (b.device == device) return;
  if (b.device >= 0) throw std::logic_error(fmt::format("cuda_init({}): already running on GPU {}", device, b.device));
  const int count = cuda_device_count();
  if (device < 0 || device >= count)
    throw UserError(fmt::format("GPU {} is not available: this machine has {} usable GPU(s)", device, count));
  cuda::check(cudaSetDevice(device), "set device");
  cuda::check(cudaStreamCreateWithFlags(&b.stream, cudaStreamNonBlocking), "stream create");
  if (!cuda::cublas_functions().gemm_ex) cuda::cublas_functions() = cuda::load_cublas();
  cuda::check_cublas(cuda::cublas_functions().create(&b.cublas), "create");
  cuda::check_cublas(cuda::cublas_functions().set_stream(b.cublas, b.stream), "set stream");
  b.allocator = std::make_unique<CachingAllocator>(cuda::raw_allocate, cuda::raw_release, fmt::format("GPU {}", device));
  b.device = device;
  install_device_memory_hooks(Device::CUDA, {cuda::hook_allocate, cuda::hook_release, cuda::hook_fill_zero});
}

bool cuda_initialized() { return cuda::backend().device >= 0; }

void cuda_synchronize() {
  // A hung GPU (or an NCCL kernel waiting on a stalled rank) shows here first.
  const WaitScope waiting("waiting for the GPU to finish its work");
  cuda::check(cudaStreamSynchronize(cuda::ready().stream), "stream synchronize");
}

MemoryStats cuda_memory_stats() {
  cuda::Backend& b = cuda::backend();
  return b.allocator ? b.allocator->stats() : MemoryStats{};
}
void cuda_reset_peak_memory() {
  if (cuda::backend().allocator) cuda::backend().allocator->reset_peaks();
}
void cuda_empty_cache() {
  if (cuda::backend().allocator) cuda::backend().allocator->empty_cache();
}

void* cuda_compute_stream() { return cuda_initialized() ? static_cast<void*>(cuda::stream()) : nullptr; }

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (bytes == 0) return;
  if (dst_device == Device::CPU && src_device == Device::CPU) {
    std::memcpy(dst, src, bytes);
    return;
  }
  cudaStream_t s = cuda::ready().stream;
  cuda::check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s), "copy");
  // The host may read (or free) its side as soon as we return.
  if (dst_device == Device::CPU || src_device == Device::CPU) cuda::check(cudaStreamSynchronize(s), "copy synchronize");
}

#else  // built without CUDA

int cuda_device_count() { return 0; }
void cuda_init(int device) {
  throw UserError(fmt::format("GPU {} requested, but this fsdpq was built without CUDA", device));
}
bool cuda_initialized() { return false; }
void cuda_synchronize() {}
MemoryStats cuda_memory_stats() { return {}; }
void cuda_reset_peak_memory() {}
void cuda_empty_cache() {}
void* cuda_compute_stream() { return nullptr; }
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (dst_device != Device::CPU || src_device != Device::CPU)
    throw std::logic_error("copy_bytes: a CUDA tensor in a build without CUDA");
  if (bytes) std::memcpy(dst, src, bytes);
}

#endif

void no_cuda(const char* what) {
  throw std::logic_error(fmt::format("{}: this fsdpq was built without CUDA", what));
}

void copy_tensor(TensorView dst, const TensorView& src) {
  if (dst.dtype != src.dtype || dst.numel() != src.numel())
    throw std::logic_error(fmt::format("copy_tensor: {} into {}", src.describe(), dst.describe()));
  copy_bytes(dst.data, dst.device, src.data, src.device, src.nbytes());
}

void* HostStaging::reserve(size_t bytes) {
  if (bytes <= size_ && data_) return data_;
  release();
  const size_t size = std::max<size_t>(bytes, 64);
#ifdef FSDPQ_WITH_CUDA
  if (cuda_initialized() && cudaHostAlloc(&data_, size, cudaHostAllocDefault) == cudaSuccess) {
    pinned_ = true;
    size_ = size;
    return data_;
  }
  cudaGetLastError();  // pinning can fail (locked-memory limits): ordinary memory still works
#endif
  data_ = std::malloc(size);
  if (!data_) fail_host_allocation(size, "a staging buffer of host⇄GPU copies");
  pinned_ = false;
  size_ = size;
  return data_;
}

void HostStaging::release() {
  if (!data_) return;
#ifdef FSDPQ_WITH_CUDA
  if (pinned_) {
    cudaFreeHost(data_);
  } else {
    std::free(data_);
  }
#else
  std::free(data_);
#endif
  data_ = nullptr;
  size_ = 0;
}

HostStaging::~HostStaging() { release(); }

Tensor copy_to(const TensorView& src, Device device) {
  Tensor out = Tensor::empty(src.shape, src.dtype, device);
  copy_tensor(out, src);
  return out;
}

}  // namespace fsdpq
