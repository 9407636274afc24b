#include "backend/cuda_backend.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

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
  symbol(api.destroy, "cublasDestroy_v2");
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

// OnSideStream's redirection of this thread's queued work (a null stream: the compute stream).
thread_local Queue queue_override;

// Blocks freed while this thread's work went to a side stream: work queued there may still use
// them, and the caching allocator's pool belongs to the compute stream, so each goes back to the
// pool only once the compute stream is ordered after its release (it waited for a side stream mark
// taken after it: compute_stream_joined) or the side stream has passed it (an event recorded at
// the release, checked on each allocation; all are waited for before an out-of-memory error).
// PyTorch's recordStream, in the stream-ordered form.
struct SideReleases {
  struct Pending {
    void* block;
    cudaStream_t stream;
    uint64_t number;  // of the stream's releases
    cudaEvent_t passed;
  };
  std::mutex mutex;
  std::vector<Pending> pending;
  std::vector<std::pair<cudaStream_t, uint64_t>> counts;  // per stream, its releases so far

  uint64_t& count_of(cudaStream_t stream) {
    for (auto& [s, n] : counts)
      if (s == stream) return n;
    return counts.emplace_back(stream, 0).second;
  }
  void add(void* block, cudaStream_t stream) {
    cudaEvent_t passed = nullptr;
    check(cudaEventCreateWithFlags(&passed, cudaEventDisableTiming), "event create (side release)");
    check(cudaEventRecord(passed, stream), "event record (side release)");
    const std::lock_guard lock(mutex);
    pending.push_back({block, stream, count_of(stream)++, passed});
  }
  uint64_t so_far(cudaStream_t stream) {
    const std::lock_guard lock(mutex);
    return count_of(stream);
  }
  // Returns to `allocator` the blocks that `done` says may go.
  template <typename Done>
  void settle(CachingAllocator& allocator, Done&& done) {
    const std::lock_guard lock(mutex);
    std::erase_if(pending, [&](const Pending& p) {
      if (!done(p)) return false;
      cudaEventDestroy(p.passed);
      allocator.release(p.block);
      return true;
    });
  }
};

SideReleases& side_releases() {
  static SideReleases releases;
  return releases;
}

void* hook_allocate(size_t bytes) {
  CachingAllocator& allocator = *ready().allocator;
  side_releases().settle(allocator, [](const SideReleases::Pending& p) { return cudaEventQuery(p.passed) == cudaSuccess; });
  try {
    return allocator.allocate(bytes);
  } catch (const DeviceOutOfMemory&) {
    side_releases().settle(allocator, [](const SideReleases::Pending& p) {
      check(cudaEventSynchronize(p.passed), "event synchronize (side release)");
      return true;
    });
    return allocator.allocate(bytes);
  }
}
void hook_release(void* p) {
  Backend& b = backend();
  if (!b.allocator) return;  // at exit the backend may be gone already
  if (queue_override.stream) return side_releases().add(p, queue_override.stream);
  b.allocator->release(p);
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

cudaStream_t stream() { return queue_override.stream ? queue_override.stream : ready().stream; }

uint64_t side_releases_so_far(cudaStream_t side) { return side_releases().so_far(side); }
void compute_stream_joined(cudaStream_t side, uint64_t releases) {
  if (queue_override.stream) return;  // (a side stream waited, not the compute stream)
  side_releases().settle(*ready().allocator,
                         [&](const SideReleases::Pending& p) { return p.stream == side && p.number < releases; });
}
Queue redirect_queue(Queue to) {
  const Queue previous = queue_override;
  queue_override = to;
  return previous;
}
cublasHandle_t cublas() {
  Backend& b = ready();
  if (!queue_override.stream) return b.cublas;  // (other threads may use the compute stream's handle too)
  if (!queue_override.cublas) throw std::logic_error("cuBLAS is called on a side stream that has no handle slot");
  cublasHandle_t& handle = *queue_override.cublas;
  if (!handle) {
    const CublasApi& api = cublas_api();
    cublasMath_t mode{};
    check_cublas(api.get_math_mode(b.cublas, &mode), "GetMathMode");
    check_cublas(api.create(&handle), "create (side stream)");
    check_cublas(api.set_stream(handle, queue_override.stream), "set stream (side stream)");
    check_cublas(api.set_math_mode(handle, mode), "SetMathMode (side stream)");
  }
  return handle;
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
