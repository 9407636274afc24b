// RMSNorm exactly as HF LlamaRMSNorm computes it:
//   variance = mean(x.float()^2);  n = x.float() * rsqrt(variance + eps)
//   y = weight * n.to(x.dtype)     (n is rounded to x's storage dtype, then the product is rounded to y's)
#pragma once
#include "backend/tensor.h"

namespace fsdpq {

// x, y: [..., C] with the same shape (y may alias x); weight: [C]; rstd: F32 with one value per
// row (numel = x.numel() / C), saved for the backward. x, y, weight: F32, BF16 or F16.
void rmsnorm_forward(TensorView y, TensorView rstd, const TensorView& x, const TensorView& weight, float eps);

// dx = d/dx (sum dy * y) and dweight += sum over rows of dy * n (dweight F32 [C], accumulated;
// not computed when dweight.data is null: a frozen weight). dx may alias dy. The rounding of n in the forward is treated as the identity (straight-through).
void rmsnorm_backward(TensorView dx, TensorView dweight, const TensorView& dy, const TensorView& x,
                      const TensorView& weight, const TensorView& rstd);

// The Llama layer's pairs, each as one op: on the GPU one pass over each row where the row fits the
// fused kernels (kernels/rmsnorm.cuh), elsewhere the two ops in turn (the same bits on the CPU).
//   residual_rmsnorm_forward: x2 = residual + x2 (residual_add, rounded to x2's dtype), then
//     y = rmsnorm(x2) (rmsnorm_forward).
//   rmsnorm_backward_add: d_acc = d_acc + rmsnorm_backward's dx for dy (dx rounded to dy's dtype
//     first: rmsnorm_backward into dy, then residual_add(d_acc, d_acc, dy)); dweight as in
//     rmsnorm_backward; dy's contents are unspecified afterwards.
void residual_rmsnorm_forward(TensorView x2, TensorView y, TensorView rstd, const TensorView& residual,
                              const TensorView& weight, float eps);
void rmsnorm_backward_add(TensorView d_acc, TensorView dweight, TensorView dy, const TensorView& x,
                          const TensorView& weight, const TensorView& rstd);

}  // namespace fsdpq
