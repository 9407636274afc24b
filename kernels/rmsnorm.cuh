// RMSNorm (HF LlamaRMSNorm) on the GPU, the same arithmetic as src/ops/rmsnorm.cpp: fp32 sum of
// squares (a block tree instead of the CPU's 8 lanes), n = x * rstd rounded to x's type, y = w * n
// rounded to y's. The backward's dweight (fp32, +=) sums fixed chunks of rows into a workspace and
// then the chunks in order, so it is deterministic; dx may alias dy (dweight reads dy first).
#pragma once
#include <cstdint>

#include "kernels/kernel_types.cuh"

namespace fsdpq::cuda {

// x, y: [rows, C] (y may alias x); weight: [C]; rstd: fp32 [rows].
void rmsnorm_forward(void* y, KType y_type, float* rstd, const void* x, KType x_type, const void* weight,
                     KType weight_type, int64_t rows, int64_t C, float eps, cudaStream_t stream);

// The fp32 elements rmsnorm_backward's workspace needs.
int64_t rmsnorm_backward_workspace(int64_t rows, int64_t C);
// dx = rstd * (g - n * mean(g * n)) with g = dy * w, n = x * rstd; dweight[c] += Σ_r dy * round(n).
// dweight (and workspace) null: a frozen weight, dx only.
void rmsnorm_backward(void* dx, KType dx_type, float* dweight, const void* dy, KType dy_type, const void* x,
                      KType x_type, const void* weight, KType weight_type, const float* rstd, int64_t rows,
                      int64_t C, float* workspace, cudaStream_t stream);

}  // namespace fsdpq::cuda
