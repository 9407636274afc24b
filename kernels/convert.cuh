// Element-type conversions on the GPU (fp32 ⇄ bf16 / fp16). The host's util/bf16.h must give
// the same bits; tests/gpu/convert_gpu_test.cu checks that on random inputs.
#pragma once
#include <cstdint>

#include <cuda_runtime.h>

namespace fsdpq::cuda {

// out[i] = bits of __float2bfloat16(in[i]) (round to nearest even).
void float_to_bf16(const float* in, uint16_t* out, int64_t n, cudaStream_t stream);
// out[i] = bits of __float2half(in[i]) (round to nearest even).
void float_to_f16(const float* in, uint16_t* out, int64_t n, cudaStream_t stream);

}  // namespace fsdpq::cuda
