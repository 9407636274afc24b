// FSDPQ_HOST_DEVICE_INLINE marks a function that host C++ and CUDA kernels both call: inlined
// __host__ __device__ under nvcc, plain inline for the host compiler. For the headers that state,
// once, what both sides compute (kernels/splitmix64.h, kernels/lora_dropout_mask.h).
#pragma once

#ifdef __CUDACC__
#define FSDPQ_HOST_DEVICE_INLINE __host__ __device__ __forceinline__
#else
#define FSDPQ_HOST_DEVICE_INLINE inline
#endif
