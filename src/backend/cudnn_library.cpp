#include "backend/cudnn_library.h"

#include <fmt/format.h>

namespace fsdpq::cudnn {

std::string version_text(size_t version) {
  return fmt::format("{}.{}.{}", version / 10000, version % 10000 / 100, version % 100);
}

}  // namespace fsdpq::cudnn

#ifdef FSDPQ_WITH_CUDA
#include <cudnn.h>
#include <dlfcn.h>

#include <cstdlib>
#include <type_traits>

#include "backend/cuda_backend.h"

// cudnn-frontend, built with NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING, declares this handle and looks
// up every cuDNN function in it; the library is fsdpq's to open (library() below).
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}

namespace fsdpq::cudnn {
namespace {

template <class Fn>
Fn symbol(void* dl_handle, const char* name) {
  return reinterpret_cast<Fn>(dlsym(dl_handle, name));
}

// The CUDA runtime cuDNN was built for must be the one fsdpq runs on (a CUDA 12 cuDNN beside
// CUDA 13 fails later, in obscure ways).
std::string cudart_mismatch(void* dl_handle) {
  const auto cudart_version = symbol<decltype(&cudnnGetCudartVersion)>(dl_handle, "cudnnGetCudartVersion");
  if (!cudart_version) return "it has no cudnnGetCudartVersion";
  const size_t built_for = cudart_version();
  if (built_for / 1000 == CUDART_VERSION / 1000) return "";
  return fmt::format("it was built for CUDA {}.{}, fsdpq runs on CUDA {}.{} (install the cuDNN 9 of CUDA {})",
                     built_for / 1000, built_for % 1000 / 10, CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10,
                     CUDART_VERSION / 1000);
}

// A handle on the current GPU that queues its work on the compute stream.
cudnnContext* create_handle(void* dl_handle, std::string* why_not) {
  const auto create = symbol<decltype(&cudnnCreate)>(dl_handle, "cudnnCreate");
  const auto set_stream = symbol<decltype(&cudnnSetStream)>(dl_handle, "cudnnSetStream");
  const auto describe = symbol<decltype(&cudnnGetErrorString)>(dl_handle, "cudnnGetErrorString");
  if (!create || !set_stream || !describe) {
    *why_not = "libcudnn lacks cudnnCreate, cudnnSetStream or cudnnGetErrorString";
    return nullptr;
  }
  cudnnHandle_t handle = nullptr;
  cudnnStatus_t status = create(&handle);
  if (status == CUDNN_STATUS_SUCCESS) status = set_stream(handle, cuda::stream());
  if (status != CUDNN_STATUS_SUCCESS) {
    *why_not = fmt::format("cudnnCreate / cudnnSetStream failed: {}", describe(status));
    return nullptr;
  }
  return handle;  // never destroyed: at exit the CUDA context may already be gone
}

struct LoadedOnce {
  Library library;
  std::string why_not;  // empty when library.handle is set
};

LoadedOnce load() {
  LoadedOnce result;
  OpenedLibrary opened = open_cudnn(default_candidates());
  if (!opened.dl_handle) {
    result.why_not = opened.why_not;
    return result;
  }
  // cudnn-frontend opens a libcudart of its own choosing (12 before 13) unless told; make it the
  // one this binary is linked with, even where both are on the library path.
  setenv("CUDNN_FRONTEND_CUDART_LIB_NAME", fmt::format("libcudart.so.{}", CUDART_VERSION / 1000).c_str(), 0);
  cudnn_frontend::cudnn_dlhandle = opened.dl_handle;
  result.library.handle = create_handle(opened.dl_handle, &result.why_not);
  result.library.version = opened.version;
  result.library.path = opened.path;
  return result;
}

}  // namespace

std::vector<std::string> default_candidates() {
  return {"libcudnn.so.9", "/usr/local/cuda/lib64/libcudnn.so.9"};
}

OpenedLibrary open_cudnn(const std::vector<std::string>& candidates) {
  OpenedLibrary result;
  std::string tried;
  for (const std::string& name : candidates) {
    void* dl_handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!dl_handle) {
      tried += fmt::format("\n  {}: {}", name, dlerror());
      continue;
    }
    const auto get_version = symbol<decltype(&cudnnGetVersion)>(dl_handle, "cudnnGetVersion");
    const size_t version = get_version ? get_version() : 0;
    std::string problem;
    if (version < kMinimumVersion || version >= kMinimumVersion + 10000)
      problem = fmt::format("version {}, fsdpq needs cuDNN 9 (at least {})", version_text(version),
                            version_text(kMinimumVersion));
    else
      problem = cudart_mismatch(dl_handle);
    if (!problem.empty()) {
      tried += fmt::format("\n  {}: {}", name, problem);
      dlclose(dl_handle);
      continue;
    }
    result.dl_handle = dl_handle;
    result.version = version;
    result.path = name;
    return result;
  }
  result.why_not = "no usable cuDNN 9 (add the folder of libcudnn.so.9, e.g. PyTorch's nvidia/cudnn/lib, to "
                   "LD_LIBRARY_PATH):" + tried;
  return result;
}

const Library* library(std::string* why_not) {
  static const LoadedOnce loaded = load();  // thread-safe, and tried once per process
  if (loaded.library.handle) return &loaded.library;
  *why_not = loaded.why_not;
  return nullptr;
}

}  // namespace fsdpq::cudnn

#else  // built without CUDA

namespace fsdpq::cudnn {

std::vector<std::string> default_candidates() { return {}; }
OpenedLibrary open_cudnn(const std::vector<std::string>&) {
  return OpenedLibrary{nullptr, 0, "", "this fsdpq was built without CUDA"};
}
const Library* library(std::string* why_not) {
  *why_not = "this fsdpq was built without CUDA";
  return nullptr;
}

}  // namespace fsdpq::cudnn

#endif
