// Small elementwise ops the model and trainer need between the big ones. Every tensor is F32, BF16
// or F16 unless stated; math in fp32, one rounding on store; outputs may alias inputs.
#pragma once
#include <span>

#include "backend/matrix_view.h"
#include "backend/tensor.h"

namespace fsdpq {

// out = a + b (the residual stream). a, b, out: the same element count.
void residual_add(TensorView out, const TensorView& a, const TensorView& b);

// x = x * factor.
void scale_in_place(TensorView x, float factor);

// dst (F32) += src: gradient accumulation into an fp32 buffer.
void accumulate(TensorView dst, const TensorView& src);

// y = y + factor * x.
void add_scaled(TensorView y, const TensorView& x, float factor);

// dst = src converted to dst's dtype (round to nearest even into BF16).
void copy_convert(TensorView dst, const TensorView& src);

// dst = scale * src, a block of rows and columns of each (rows and columns alike; either may be a
// block of a wider matrix's columns, backend/matrix_view.h).
void copy_block(const MatrixView& dst, const MatrixView& src, float scale = 1.0f);

// One copy_block: dst = scale * src.
struct BlockCopy {
  MatrixView dst, src;
  float scale = 1.0f;
};
// copy_block for each of `copies` (blocks that do not overlap), with the same bits, in as few passes
// as the device allows: on the GPU one launch for up to 8 blocks of one 16-bit type whose columns,
// row strides and first elements are whole 16-byte chunks (every folded LoRA block of a Llama
// layer), a copy_block launch for any other.
void copy_blocks(std::span<const BlockCopy> copies);

// x = 0 (any dtype).
void fill_zero(TensorView x);

// sum of x² in double (for gradient norms).
double sum_of_squares(const TensorView& x);

}  // namespace fsdpq
