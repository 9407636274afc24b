// Linear layers (y = x·Wᵀ, weights [out, in] as HF stores them) and their gradients, on the
// blocked fp32-accumulating GEMM of gemm.h (on the GPU, cuBLAS: src/ops/cuda/cublas_gemm.cpp).
// Every tensor is F32, BF16 or F16; x, y, dx, dy may have any leading dims ([B, T, C] or
// [B*T, C]): they are read as matrices [rows, last dim].
// Each op writes out = (accumulate ? out : 0) + scale * product, rounded once to out's dtype.
#pragma once
#include <initializer_list>

#include "backend/matrix_view.h"
#include "backend/tensor.h"

namespace fsdpq {

// An activation or a weight is a MatrixView (backend/matrix_view.h): a whole tensor read as
// [rows, last dim], or a block of a wider one's columns.

// out[M, N] (+)= scale * x[M, K] · W[N, K]ᵀ
void linear_forward(const MatrixView& out, const MatrixView& x, const MatrixView& W, bool accumulate = false,
                    float scale = 1.0f);

// dx[M, K] (+)= scale * dy[M, N] · W[N, K]
void linear_backward_input(const MatrixView& dx, const MatrixView& dy, const MatrixView& W, bool accumulate = false,
                           float scale = 1.0f);

// dW[N, K] (+)= scale * dy[M, N]ᵀ · x[M, K]   (dW is normally F32: gradients accumulate in fp32)
void linear_backward_weight(TensorView dW, const MatrixView& dy, const MatrixView& x, bool accumulate = false,
                            float scale = 1.0f);

// The GPU's rounding of GEMM operands, for a gradient that several GEMMs read. cuBLAS multiplies
// one storage type, so on the GPU an F32 operand that meets a 16-bit one is rounded to that type
// first (as autocast does). When every GEMM reading x meets a weight of the same 16-bit type, one
// rounded copy (kept alive by `storage`) serves them all with the bits each GEMM would have made;
// this returns it, timed as `section` (a literal) when one is named. Otherwise — on the CPU, which
// multiplies in fp32, for x not F32, or weights of several types — it returns x itself.
TensorView round_for_gemms(const TensorView& x, std::initializer_list<DType> weight_dtypes, Tensor& storage,
                           const char* section = nullptr);

}  // namespace fsdpq
