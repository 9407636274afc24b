// cuDNN, opened at run time (dlopen of libcudnn.so.9) the first time an op asks for it, never
// linked: the CPU build, CUDA-less machines and GPU runs that never choose a cuDNN route neither
// need it nor pay for loading it (cuDNN's engines are over 1 GiB of libraries). The
// cudnn-frontend headers (third_party/cudnn_frontend, built with
// NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING) find every cuDNN function through the handle opened here.
//
// Where cuDNN comes from: the dynamic linker's search (LD_LIBRARY_PATH first), then
// /usr/local/cuda/lib64. On a machine with PyTorch, its own cuDNN 9 is in site-packages'
// nvidia/cudnn/lib; put that folder on LD_LIBRARY_PATH.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

struct cudnnContext;  // cudnn.h's handle type, cudnnHandle_t = cudnnContext*

namespace fsdpq::cudnn {

// The oldest cuDNN fsdpq uses: 9.0.0 (cudnnGetVersion() counts 9.19.0 as 91900). Features of later
// versions are checked by cudnn-frontend, which refuses a graph the loaded cuDNN cannot run.
inline constexpr size_t kMinimumVersion = 90000;

// An opened libcudnn: its dlopen handle and version, or why none could be used.
struct OpenedLibrary {
  void* dl_handle = nullptr;
  size_t version = 0;
  std::string path;  // the candidate that opened
  std::string why_not;  // empty when dl_handle is set
};

// Tries each candidate in order (a bare name goes through the dynamic linker's search) and checks
// the version. Touches no GPU and no global state, so the CPU tests run it.
OpenedLibrary open_cudnn(const std::vector<std::string>& candidates);
std::vector<std::string> default_candidates();

// "9.19.0".
std::string version_text(size_t version);

// This process's cuDNN: the library (opened once, for every later call), its version, and a
// handle on the current GPU whose work runs on the compute stream (cuda_init must have run).
struct Library {
  cudnnContext* handle = nullptr;
  size_t version = 0;
  std::string path;
};

// The process's cuDNN, or nullptr with the reason in *why_not (the same answer on every call: a
// missing cuDNN is looked for once).
const Library* library(std::string* why_not);

}  // namespace fsdpq::cudnn
