// A tensor read or written as a matrix [rows, last dim], or a block of its columns in place: one
// adapter's columns of a LoRA group's stacked xa (ops/lora.h), the base weight inside a folded
// LoRA weight [W | 0 | s·B] (model/llama_layer.h). The ops that take one (ops/matmul.h, a
// frozen weight's dequantisation) read and write rows row_stride() elements apart.
#pragma once
#include <cstdint>

#include "backend/tensor.h"

namespace fsdpq {

struct MatrixView {
  TensorView tensor;
  int64_t first_column = 0;
  int64_t columns = -1;  // -1: every column

  MatrixView() = default;
  MatrixView(const TensorView& whole) : tensor(whole) {}  // NOLINT: implicit on purpose
  MatrixView(const Tensor& whole) : tensor(whole.view()) {}  // NOLINT
  MatrixView(const TensorView& wide, int64_t first, int64_t count) : tensor(wide), first_column(first), columns(count) {}

  int64_t rows() const { return tensor.shape.rows(); }
  int64_t cols() const { return columns < 0 ? tensor.shape.last() : columns; }
  int64_t row_stride() const { return tensor.shape.last(); }
  int64_t numel() const { return rows() * cols(); }
  DType dtype() const { return tensor.dtype; }
  Device device() const { return tensor.device; }
  void* data() const {  // the block's first element
    return static_cast<char*>(tensor.data) + first_column * static_cast<int64_t>(dtype_size(tensor.dtype));
  }
  bool whole() const { return first_column == 0 && cols() == row_stride(); }
  // The block as a tensor of its own [rows, cols]; only a whole view is one (std::logic_error else).
  TensorView as_tensor() const;
};

}  // namespace fsdpq
