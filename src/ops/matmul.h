// Linear layers (y = x·Wᵀ, weights [out, in] as HF stores them) and their gradients, on the
// blocked fp32-accumulating GEMM of gemm.h (on the GPU, cuBLAS: src/ops/cuda/cublas_gemm.cpp).
// Every tensor is F32, BF16 or F16; x, y, dx, dy may have any leading dims ([B, T, C] or
// [B*T, C]): they are read as matrices [rows, last dim].
// Each op writes out = (accumulate ? out : 0) + scale * product, rounded once to out's dtype.
#pragma once
#include <initializer_list>

#include "backend/tensor.h"

namespace fsdpq {

// An activation read or written as a matrix: the whole tensor as [rows, last dim], or the block of
// its columns [first_column, first_column + columns) in place (one adapter's columns of a LoRA
// group's stacked xa, ops/lora.h). Any TensorView converts to the whole-tensor form.
struct MatrixView {
  TensorView tensor;
  int64_t first_column = 0;
  int64_t columns = -1;  // -1: every column

  MatrixView(const TensorView& whole) : tensor(whole) {}  // NOLINT: implicit on purpose
  MatrixView(const Tensor& whole) : tensor(whole.view()) {}  // NOLINT
  MatrixView(const TensorView& wide, int64_t first, int64_t count) : tensor(wide), first_column(first), columns(count) {}

  int64_t rows() const { return tensor.shape.rows(); }
  int64_t cols() const { return columns < 0 ? tensor.shape.last() : columns; }
  int64_t row_stride() const { return tensor.shape.last(); }
  void* data() const;  // the block's first element
  bool whole() const { return first_column == 0 && cols() == row_stride(); }
};

// out[M, N] (+)= scale * x[M, K] · W[N, K]ᵀ
void linear_forward(const MatrixView& out, const MatrixView& x, const TensorView& W, bool accumulate = false,
                    float scale = 1.0f);

// dx[M, K] (+)= scale * dy[M, N] · W[N, K]
void linear_backward_input(const MatrixView& dx, const MatrixView& dy, const TensorView& W, bool accumulate = false,
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
