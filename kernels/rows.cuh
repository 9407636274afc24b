// Row selection on the GPU (src/ops/rows.h): copies whole rows between a matrix and a compact one,
// byte for byte. Rows are trusted (the op's caller builds them).
#pragma once
#include <cstdint>

#include "kernels/kernel_types.cuh"

namespace fsdpq::cuda {

// For j < R: dst row (dst_rows ? dst_rows[j] : j) = src row (src_rows ? src_rows[j] : j), rows of
// row_bytes bytes (a multiple of 2) at row pitch row_bytes on both sides.
void copy_rows(void* dst, const int32_t* dst_rows, const void* src, const int32_t* src_rows, int64_t R,
               int64_t row_bytes, cudaStream_t stream);

}  // namespace fsdpq::cuda
