// The CUDA backend's GEMM: gemm.h's contract (C = (accumulate ? C : 0) + scale * A·B, row-major
// output, operands read through strides) on cuBLAS, fp32 accumulation (CUBLAS_COMPUTE_32F).
// cuBLAS needs A and B in one storage type: F32 with an F32 C, or BF16 / F16 with a C of the same
// type or F32. Each operand needs a unit stride in one direction (any matmul.h view has it).
#pragma once
#include "ops/gemm.h"

namespace fsdpq {

void cublas_gemm(const MatrixOutput& c, const MatrixOperand& a, const MatrixOperand& b, bool accumulate, float scale);

}  // namespace fsdpq
