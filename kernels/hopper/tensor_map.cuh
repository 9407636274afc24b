// Tensor maps for the bulk tensor copies (kernels/hopper/tma.cuh): how the copy engine sees a
// [B, T, heads, D] tensor of 16-bit elements (attention's q, k, v, out). Host code.
#pragma once
#include <cstdint>

#include <cuda.h>  // CUtensorMap and its enums only: the encoder is looked up at run time, not linked

namespace fsdpq::cuda::hopper {

// Columns of D per box: 64 16-bit elements are 128 bytes, the span of the 128-byte swizzle.
constexpr int kBoxColumns = 64;

// The map of a [B, T, heads, D] tensor of 16-bit elements at `base` (16-byte aligned, D a
// multiple of 8), copied in boxes of kBoxColumns elements of D by `rows` positions of T, of one
// head of one batch (coordinates {d, t, head, b}). A box lands in shared memory as `rows` rows of
// 128 bytes, 128-byte swizzled: the 16-byte chunk c of row r sits at chunk c ^ (r % 8) — the layout
// wgmma's descriptors read (kernels/hopper/wgmma.cuh). Positions past T load as zeros and are not
// stored. Throws std::runtime_error when the driver refuses the map.
CUtensorMap head_tensor_map(const void* base, int64_t B, int64_t T, int64_t heads, int64_t D, int rows);

// The same for the [rows, cols] block of a row-major matrix of 16-bit elements whose rows are
// row_stride elements apart (a block of a wider matrix's columns: base 16-byte aligned, row_stride
// a multiple of 8), in boxes of kBoxColumns columns by box_rows rows (coordinates {column, row, 0, 0}).
CUtensorMap matrix_tensor_map(const void* base, int64_t rows, int64_t cols, int64_t row_stride, int box_rows);

}  // namespace fsdpq::cuda::hopper
