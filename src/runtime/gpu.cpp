#include "runtime/gpu.h"

#include "util/error.h"

#include <cstdlib>
#include <string>

#ifdef FSDPQ_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace fsdpq {

GpuInfo select_gpu(const World& world) {
  GpuInfo info;
#ifdef FSDPQ_WITH_CUDA
  info.built_with_cuda = true;
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    cudaGetLastError();  // clear the sticky "no device" error
    info.name = err == cudaSuccess ? "no CUDA device" : cudaGetErrorString(err);
    return info;
  }
  info.visible_devices = count;
  // FSDPQ_SHARE_GPUS=1 lets several ranks share a GPU (rank r on GPU r mod count): a way to test
  // multi-rank runs on fewer GPUs. NCCL refuses two ranks on one GPU, so their collectives then
  // go through MPI staged via the host (fsdp/device_collectives.h). Each rank has the GPU's
  // memory and compute only in part.
  const char* share = std::getenv("FSDPQ_SHARE_GPUS");
  const bool shared = share != nullptr && std::string(share) == "1";
  if (world.local_size > count && !shared)
    fail("{} ranks run on node {} but it has {} visible GPU(s): start one rank per GPU "
         "(or hide the GPUs with CUDA_VISIBLE_DEVICES= to run on the CPU, or set FSDPQ_SHARE_GPUS=1 to let "
         "ranks share them)",
         world.local_size, world.hostname, count);
  info.device = world.local_rank % count;
  info.shared = world.local_size > count;
  if (cudaSetDevice(info.device) != cudaSuccess) fail("cannot use GPU {} on {}", info.device, world.hostname);
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, info.device) == cudaSuccess) {
    info.name = prop.name;
    info.total_memory = prop.totalGlobalMem;
  }
#else
  (void)world;
  info.name = "built without CUDA";
#endif
  return info;
}

}  // namespace fsdpq
