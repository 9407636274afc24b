// The CPU matrix-multiply engine behind the linear ops (matmul.h): C = beta*C + scale * A·B with
// fp32 accumulation, operands in F32, BF16 or F16 storage read through arbitrary strides (so a
// transposed operand costs nothing extra), blocked for cache and parallel over C's rows.
#pragma once
#include "util/dtype.h"

#include <cstdint>

namespace fsdpq {

// A matrix operand: element (r, c) lives at data[r * row_stride + c * col_stride].
struct MatrixOperand {
  const void* data = nullptr;
  DType dtype = DType::F32;  // F32, BF16 or F16
  int64_t rows = 0, cols = 0;
  int64_t row_stride = 0, col_stride = 1;
};

// A row-major output matrix [rows, cols] (F32, BF16 or F16); row r starts at data + r * stride(),
// so a block of columns of a wider matrix can be written in place.
struct MatrixOutput {
  void* data = nullptr;
  DType dtype = DType::F32;
  int64_t rows = 0, cols = 0;
  int64_t row_stride = 0;  // 0: cols (contiguous rows)
  int64_t stride() const { return row_stride > 0 ? row_stride : cols; }
};

// C = (accumulate ? C : 0) + scale * A·B, with A [M, K], B [K, N], C [M, N]. Each element of C is
// summed in fp32 in a fixed order (independent of the thread count) and rounded once on store.
void gemm(const MatrixOutput& c, const MatrixOperand& a, const MatrixOperand& b, bool accumulate, float scale);

// Tests call this to exercise the portable micro-kernel on machines that would pick AVX2.
void gemm_force_portable_kernel(bool force);
// "avx2-fma" or "portable": the micro-kernel gemm uses now.
const char* gemm_kernel_name();

}  // namespace fsdpq
