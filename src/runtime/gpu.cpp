#include "runtime/gpu.h"

#include "util/error.h"

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
  if (world.local_size > count)
    fail("{} ranks run on node {} but it has {} visible GPU(s): start one rank per GPU "
         "(or hide the GPUs with CUDA_VISIBLE_DEVICES= to run on the CPU)",
         world.local_size, world.hostname, count);
  info.device = world.local_rank;
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
