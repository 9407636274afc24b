#include "kernels/hopper/sm90a_image.cuh"

#include <cuda_runtime.h>

namespace fsdpq::cuda::hopper {

std::string sm90a_unavailable(const void* kernel) {
  int device = 0, major = 0, minor = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  if (major != 9 || minor != 0)
    return "the GPU is compute capability " + std::to_string(major) + "." + std::to_string(minor) +
           "; the wgmma kernel is built for sm_90a (9.0) alone";
  // The image is sm_90a machine code only: this fails where the driver cannot load it.
  cudaFuncAttributes attributes{};
  const cudaError_t err = cudaFuncGetAttributes(&attributes, kernel);
  if (err != cudaSuccess) {
    cudaGetLastError();  // not a launch error of anyone's
    return std::string("the sm_90a kernel image does not load here: ") + cudaGetErrorString(err);
  }
  return "";
}

}  // namespace fsdpq::cuda::hopper
