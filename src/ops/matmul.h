// Linear layers (y = x·Wᵀ, weights [out, in] as HF stores them) and their gradients, on the
// blocked fp32-accumulating GEMM of gemm.h. Every tensor is F32 or BF16; x, y, dx, dy may have
// any leading dims ([B, T, C] or [B*T, C]): they are read as matrices [rows, last dim].
// Each op writes out = (accumulate ? out : 0) + scale * product, rounded once to out's dtype.
#pragma once
#include "backend/tensor.h"

namespace fsdpq {

// out[M, N] (+)= scale * x[M, K] · W[N, K]ᵀ
void linear_forward(TensorView out, const TensorView& x, const TensorView& W, bool accumulate = false,
                    float scale = 1.0f);

// dx[M, K] (+)= scale * dy[M, N] · W[N, K]
void linear_backward_input(TensorView dx, const TensorView& dy, const TensorView& W, bool accumulate = false,
                           float scale = 1.0f);

// dW[N, K] (+)= scale * dy[M, N]ᵀ · x[M, K]   (dW is normally F32: gradients accumulate in fp32)
void linear_backward_weight(TensorView dW, const TensorView& dy, const TensorView& x, bool accumulate = false,
                            float scale = 1.0f);

}  // namespace fsdpq
