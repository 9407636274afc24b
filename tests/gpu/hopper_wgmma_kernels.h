// One warpgroup's tile product through the Hopper primitives of kernels/hopper/ (tensor maps, bulk
// tensor copies, mbarriers, wgmma descriptors), laid out exactly as the attention kernel
// (kernels/attention_sm90a.cu) lays out its two products, so that a descriptor, swizzle or
// fragment-layout bug shows up in hopper_wgmma_gpu_test.cpp as a wrong 64 x 128 product rather
// than only as a wrong attention. Built for sm_90a (tests/CMakeLists.txt); run only where
// cuda::attention_sm90a_unavailable() is "".
#pragma once
#include <cuda_runtime.h>

#include "kernels/kernel_types.cuh"

namespace fsdpq::test {

// c [64][128] fp32 = a [64][128] · bᵀ with b [128][128]: both operands K-major in shared memory,
// 128 columns of K in two column blocks — attention's S = Q Kᵀ at D 128.
void wgmma_tile_ss(float* c, const void* a, const void* b, cuda::KType type, cudaStream_t stream);

// c [64][128] fp32 = a [64][64] · b with b [64][128]: a from registers (loaded in the wgmma A
// layout), b MN-major in shared memory, N in two column blocks — attention's O = P V at D 128.
void wgmma_tile_rs(float* c, const void* a, const void* b, cuda::KType type, cudaStream_t stream);

// c [64][64] fp32 = a [64][64] · bᵀ with b [64][64]: a from the copy engine's swizzled tile into
// registers by ldmatrix, b K-major in shared memory — the LoRA down product's x · A_iᵀ
// (kernels/lora_fused_sm90a.cu).
void wgmma_tile_rs_swizzled(float* c, const void* a, const void* b, cuda::KType type, cudaStream_t stream);

// c [64][64] fp32 = aᵀ · b with a, b [64][64] row-major: both MN-major in shared memory — the LoRA
// weight gradient's dxaᵀ · x (kernels/lora_fused_sm90a.cu).
void wgmma_tile_ss_mn_major(float* c, const void* a, const void* b, cuda::KType type, cudaStream_t stream);

}  // namespace fsdpq::test
