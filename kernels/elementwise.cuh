// The small elementwise ops of src/ops/elementwise.h on the GPU. Each output is rounded once on
// store; outputs may alias inputs element for element (every element is read before it is
// written). Arithmetic that the CPU does as separate multiply and add is done with _rn
// intrinsics here (no FMA contraction), so these results are bit-identical to the CPU's.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/kernel_types.cuh"

namespace fsdpq::cuda {

// out = a + b.
void residual_add(void* out, KType out_type, const void* a, KType a_type, const void* b, KType b_type, int64_t n,
                  cudaStream_t stream);
// x = x * factor.
void scale_in_place(void* x, KType type, float factor, int64_t n, cudaStream_t stream);
// dst (fp32) += src.
void accumulate(float* dst, const void* src, KType src_type, int64_t n, cudaStream_t stream);
// y = y + factor * x.
void add_scaled(void* y, KType y_type, const void* x, KType x_type, float factor, int64_t n, cudaStream_t stream);
// dst = src converted to dst's type.
void copy_convert(void* dst, KType dst_type, const void* src, KType src_type, int64_t n, cudaStream_t stream);
// dst = scale * src for a [rows, cols] block of each (rows dst_stride and src_stride elements
// apart); same-type copies with scale 1 move 16 bytes a thread where aligned, else
// cudaMemcpy2DAsync.
void copy_block(void* dst, KType dst_type, int64_t dst_stride, const void* src, KType src_type, int64_t src_stride,
                int64_t rows, int64_t cols, float scale, cudaStream_t stream);
// Several copy_block's at once, each with copy_block's bits: one launch for up to kMaxBlockCopies
// blocks (a folded LoRA group's xa and s·B blocks, model/llama_layer.cpp, were a launch each).
// Takes 16-bit blocks of one type whose columns, row strides and pointers are whole 16-byte chunks
// (block_copy_batches); the caller copies any other block with copy_block.
struct BlockCopyArgs {
  void* dst;
  const void* src;
  int64_t dst_stride, src_stride, rows, cols;  // elements
  float scale;
};
inline constexpr int kMaxBlockCopies = 8;
bool block_copy_batches(const BlockCopyArgs& copy, KType dst_type, KType src_type);
void copy_blocks(const BlockCopyArgs* copies, int count, KType type, cudaStream_t stream);
// bytes zero bytes at x (queued on the stream).
void fill_zero(void* x, size_t bytes, cudaStream_t stream);

// sum of x² in double, deterministic: chunks of kSumOfSquaresChunk elements are reduced to fp64
// partials (a fixed tree per chunk), then one block sums the partials in a fixed order.
// workspace: device doubles, sum_of_squares_workspace(n) of them; the result is left in
// workspace[0] (the caller copies it to the host).
constexpr int64_t kSumOfSquaresChunk = 4096;
int64_t sum_of_squares_workspace(int64_t n);
void sum_of_squares(const void* x, KType type, int64_t n, double* workspace, cudaStream_t stream);

}  // namespace fsdpq::cuda
