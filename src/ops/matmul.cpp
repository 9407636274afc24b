#include "ops/matmul.h"

#include "ops/checks.h"
#include "ops/gemm.h"

namespace fsdpq {

namespace {

// A tensor read as a row-major matrix [rows, last dim], optionally transposed.
MatrixOperand matrix(const TensorView& view, bool transposed = false) {
  const int64_t rows = view.shape.rows(), cols = view.shape.last();
  if (transposed) return MatrixOperand{view.data, view.dtype, cols, rows, 1, cols};
  return MatrixOperand{view.data, view.dtype, rows, cols, cols, 1};
}

MatrixOutput output(const TensorView& view) {
  return MatrixOutput{view.data, view.dtype, view.shape.rows(), view.shape.last()};
}

void check_weight(const char* op, const char* name, const TensorView& w) {
  check_cpu_float(op, name, w);
  check_that(w.shape.rank == 2, "{}: {} must be a matrix [out, in], got {}", op, name, w.shape.to_string());
}

void check_activation(const char* op, const char* name, const TensorView& x) {
  check_cpu_float(op, name, x);
  check_that(x.shape.rank >= 1, "{}: {} must have at least one dimension", op, name);
}

}  // namespace

void linear_forward(TensorView out, const TensorView& x, const TensorView& W, bool accumulate, float scale) {
  constexpr const char* op = "linear_forward";
  check_activation(op, "x", x);
  check_activation(op, "out", out);
  check_weight(op, "W", W);
  check_that(x.shape.last() == W.shape[1] && out.shape.last() == W.shape[0] && out.shape.rows() == x.shape.rows(),
             "{}: out {} = x {} · W {}ᵀ does not fit", op, out.shape.to_string(), x.shape.to_string(),
             W.shape.to_string());
  gemm(output(out), matrix(x), matrix(W, /*transposed=*/true), accumulate, scale);
}

void linear_backward_input(TensorView dx, const TensorView& dy, const TensorView& W, bool accumulate, float scale) {
  constexpr const char* op = "linear_backward_input";
  check_activation(op, "dx", dx);
  check_activation(op, "dy", dy);
  check_weight(op, "W", W);
  check_that(dy.shape.last() == W.shape[0] && dx.shape.last() == W.shape[1] && dx.shape.rows() == dy.shape.rows(),
             "{}: dx {} = dy {} · W {} does not fit", op, dx.shape.to_string(), dy.shape.to_string(),
             W.shape.to_string());
  gemm(output(dx), matrix(dy), matrix(W), accumulate, scale);
}

void linear_backward_weight(TensorView dW, const TensorView& dy, const TensorView& x, bool accumulate, float scale) {
  constexpr const char* op = "linear_backward_weight";
  check_weight(op, "dW", dW);
  check_activation(op, "dy", dy);
  check_activation(op, "x", x);
  check_that(dW.shape[0] == dy.shape.last() && dW.shape[1] == x.shape.last() && dy.shape.rows() == x.shape.rows(),
             "{}: dW {} = dy {}ᵀ · x {} does not fit", op, dW.shape.to_string(), dy.shape.to_string(),
             x.shape.to_string());
  gemm(output(dW), matrix(dy, /*transposed=*/true), matrix(x), accumulate, scale);
}

}  // namespace fsdpq
