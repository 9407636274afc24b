#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/convert.cuh"

namespace fsdpq::cuda {
namespace {

__global__ void float_to_bf16_kernel(const float* in, uint16_t* out, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = __bfloat16_as_ushort(__float2bfloat16(in[i]));
}

__global__ void float_to_f16_kernel(const float* in, uint16_t* out, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = __half_as_ushort(__float2half(in[i]));
}

int grid_for(int64_t n) { return static_cast<int>(n / 256 + 1 < 4096 ? n / 256 + 1 : 4096); }

}  // namespace

void float_to_bf16(const float* in, uint16_t* out, int64_t n, cudaStream_t stream) {
  float_to_bf16_kernel<<<grid_for(n), 256, 0, stream>>>(in, out, n);
}

void float_to_f16(const float* in, uint16_t* out, int64_t n, cudaStream_t stream) {
  float_to_f16_kernel<<<grid_for(n), 256, 0, stream>>>(in, out, n);
}

}  // namespace fsdpq::cuda
