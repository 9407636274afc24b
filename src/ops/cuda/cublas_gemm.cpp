// The GEMM of the linear ops (ops/matmul.cpp) on cuBLAS: gemm.h's contract (C = (accumulate ? C : 0)
// + scale * A·B, row-major output, operands read through strides), fp32 accumulation
// (CUBLAS_COMPUTE_32F). cuBLAS needs A and B in one storage type: F32 with an F32 C, or BF16 / F16
// with a C of the same type or F32. Each operand needs a unit stride in one direction (any
// matmul.h view has it).
#include <fmt/format.h>

#include <cstdlib>
#include <stdexcept>
#include <string_view>

#include "backend/cuda_backend.h"
#include "ops/cuda_ops.h"

namespace fsdpq::cuda_ops {
namespace {

cudaDataType_t cuda_type(DType dtype) {
  switch (dtype) {
    case DType::F32: return CUDA_R_32F;
    case DType::BF16: return CUDA_R_16BF;
    case DType::F16: return CUDA_R_16F;
    default: break;
  }
  throw std::logic_error(fmt::format("cublas_gemm: no cuBLAS type for {}", dtype_name(dtype)));
}

// cuBLAS is column-major. A row-major C [M, N] is a column-major Cᵀ [N, M], and Cᵀ = Bᵀ·Aᵀ. A
// row-major operand with unit column stride is, read column-major, its own transpose (ld = row
// stride); one with unit row stride is itself column-major (ld = column stride). `want_t` says
// the column-major product needs this operand's transpose (Bᵀ for B, Aᵀ for A).
struct ColumnMajor {
  cublasOperation_t op;
  int64_t ld;
};
ColumnMajor column_major(const MatrixOperand& m, const char* name) {
  if (m.col_stride == 1 && (m.row_stride >= m.cols || m.rows <= 1))
    return {CUBLAS_OP_N, std::max<int64_t>(m.row_stride, std::max<int64_t>(m.cols, 1))};
  if (m.row_stride == 1 && (m.col_stride >= m.rows || m.cols <= 1))
    return {CUBLAS_OP_T, std::max<int64_t>(m.col_stride, std::max<int64_t>(m.rows, 1))};
  throw std::logic_error(fmt::format("cublas_gemm: {} [{}, {}] with strides ({}, {}) has no unit stride", name,
                                     m.rows, m.cols, m.row_stride, m.col_stride));
}

// How cuBLAS adds a product into a 16-bit C (FSDPQ_GEMM_ACCUMULATE, cuda_ops.h's GemmAccumulate).
// Its COMPUTE_32F kernels written in place round the product to C's type before C is added, so a
// product below half C's spacing is lost; COMPUTE_32F_PEDANTIC rounds the sum once, as the CPU
// does, but at ~32 TFLOP/s instead of ~780 (bench/RESULTS.md, stops 37 and 38).
// CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION on the handle changes neither (measured).
GemmAccumulate& accumulate_choice() {
  static GemmAccumulate choice = [] {
    const char* v = std::getenv("FSDPQ_GEMM_ACCUMULATE");  // runtime/environment.cpp checks the value
    return v != nullptr && std::string_view(v) == "pedantic" ? GemmAccumulate::Pedantic : GemmAccumulate::OutputType;
  }();
  return choice;
}

cublasComputeType_t compute_type(bool accumulate, DType c_type) {
  return accumulate_choice() == GemmAccumulate::Pedantic && accumulate && c_type != DType::F32 ? CUBLAS_COMPUTE_32F_PEDANTIC
                                                                                              : CUBLAS_COMPUTE_32F;
}

}  // namespace

GemmAccumulate gemm_accumulate() { return accumulate_choice(); }
void set_gemm_accumulate(GemmAccumulate accumulate) { accumulate_choice() = accumulate; }

void gemm(const MatrixOutput& c, const MatrixOperand& a, const MatrixOperand& b, bool accumulate, float scale) {
  const int64_t M = a.rows, K = a.cols, N = b.cols;
  if (b.rows != K || c.rows != M || c.cols != N)
    throw std::logic_error(fmt::format("cublas_gemm: C [{}, {}] = A [{}, {}] · B [{}, {}] does not fit", c.rows, c.cols,
                                       a.rows, a.cols, b.rows, b.cols));
  if (a.dtype != b.dtype || (a.dtype == DType::F32 && c.dtype != DType::F32) ||
      (a.dtype != DType::F32 && c.dtype != DType::F32 && c.dtype != a.dtype))
    throw std::logic_error(fmt::format("cublas_gemm: cuBLAS cannot multiply {} by {} into {}", dtype_name(a.dtype),
                                       dtype_name(b.dtype), dtype_name(c.dtype)));
  if (c.stride() < N)
    throw std::logic_error(fmt::format("cublas_gemm: C's row stride {} is below its {} columns", c.stride(), N));
  if (M == 0 || N == 0) return;
  const float alpha = scale, beta = accumulate ? 1.0f : 0.0f;
  if (K == 0) {
    // An empty sum: C = beta·C. cuBLAS handles k = 0 that way too, but say it plainly.
    const size_t element = dtype_size(c.dtype);
    if (!accumulate)
      cuda::check(cudaMemset2DAsync(c.data, static_cast<size_t>(c.stride()) * element, 0, static_cast<size_t>(N) * element,
                                    static_cast<size_t>(M), cuda::stream()),
                  "memset");
    return;
  }
  const ColumnMajor bt = column_major(b, "B"), at = column_major(a, "A");
  cuda::check_cublas(cuda::cublas_api().gemm_ex(cuda::cublas(), bt.op, at.op, static_cast<int>(N), static_cast<int>(M),
                                  static_cast<int>(K), &alpha, b.data, cuda_type(b.dtype), static_cast<int>(bt.ld),
                                  a.data, cuda_type(a.dtype), static_cast<int>(at.ld), &beta, c.data,
                                  cuda_type(c.dtype), static_cast<int>(c.stride()), compute_type(accumulate, c.dtype),
                                  CUBLAS_GEMM_DEFAULT),
                     "GemmEx");
}

}  // namespace fsdpq::cuda_ops
