// RMSNorm (HF LlamaRMSNorm) on the GPU, the same arithmetic as src/ops/rmsnorm.cpp: fp32 sum of
// squares (a block tree instead of the CPU's 8 lanes), n = x * rstd rounded to x's type, y = w * n
// rounded to y's. The backward's dweight (fp32, +=) sums fixed chunks of rows into a workspace and
// then the chunks in order, so it is deterministic; dx may alias dy (dweight reads dy first).
#pragma once
#include <cstdint>
#include <initializer_list>

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

// The layer's fused pairs (issue #24), one pass over each row with the row held in registers and
// 16-byte accesses, where rmsnorm_rows_fit says they apply (C a multiple of 8, at most 16384, every
// pointer 16-byte aligned, and x, y — or x, dy, d_acc — of one storage type); same arithmetic as the pairs of kernels they replace, up to the order
// of the row's fp32 sums:
//   residual_rmsnorm_forward: x2 = round(residual + x2) (residual_add), then y = rmsnorm(x2)
//     (residual null: y = rmsnorm(x2), x2 untouched: the plain forward, vectorized);
//   rmsnorm_backward_add: d_acc = round(d_acc + round_dy(dx)) for rmsnorm_backward's dx (dx
//     rounded to dy's type first, as the pair rmsnorm_backward into dy then residual_add gives it);
//     dweight is not computed here (rmsnorm_backward's kernels do it first where it is needed).
bool rmsnorm_rows_fit(int64_t C, std::initializer_list<const void*> pointers);
void residual_rmsnorm_forward(void* x2, KType x_type, void* y, KType y_type, float* rstd, const void* residual,
                              const void* weight, KType weight_type, int64_t rows, int64_t C, float eps,
                              cudaStream_t stream);
void rmsnorm_backward_add(void* d_acc, KType acc_type, const void* dy, KType dy_type, const void* x, KType x_type,
                          const void* weight, KType weight_type, const float* rstd, int64_t rows, int64_t C,
                          cudaStream_t stream);

}  // namespace fsdpq::cuda
