#include "ops/matmul.h"

#include "ops/checks.h"
#include "ops/cublas_gemm.h"
#include "ops/elementwise.h"
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
  check_float(op, name, w);
  check_that(w.shape.rank == 2, "{}: {} must be a matrix [out, in], got {}", op, name, w.shape.to_string());
}

void check_activation(const char* op, const char* name, const TensorView& x) {
  check_float(op, name, x);
  check_that(x.shape.rank >= 1, "{}: {} must have at least one dimension", op, name);
}

// The one storage type cuBLAS multiplies the inputs in: half precision wins, as under autocast
// (an F32 activation gradient meeting a BF16 weight is multiplied in BF16, like PyTorch's
// bf16 backward; accumulation stays fp32).
DType gpu_operand_dtype(const TensorView& out, const TensorView& p, const TensorView& q) {
  for (DType half : {DType::BF16, DType::F16})
    if (p.dtype == half || q.dtype == half || out.dtype == half) return half;
  return DType::F32;
}

// `view` in `dtype`: itself, or a converted copy kept alive by `storage`.
TensorView as_dtype(const TensorView& view, DType dtype, Tensor& storage) {
  if (view.dtype == dtype) return view;
  storage = Tensor::empty(view.shape, dtype, view.device);
  copy_convert(storage, view);
  return storage.view();
}

// Runs the product on the GPU when the operands live there; false for the CPU path.
// `product` builds the gemm operands from the (converted) views.
template <class Product>
bool gemm_on_cuda(const char* op, TensorView out, const TensorView& p, const TensorView& q, Product&& product) {
  if (!runs_on_cuda(op, {out, p, q})) return false;
  const DType dtype = gpu_operand_dtype(out, p, q);
  check_that(out.dtype == DType::F32 || out.dtype == dtype, "{}: cannot write {} from {} operands on the GPU", op,
             out.describe(), dtype_name(dtype));
  Tensor p_storage, q_storage;
  product(as_dtype(p, dtype, p_storage), as_dtype(q, dtype, q_storage));
  return true;
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
  if (gemm_on_cuda(op, out, x, W, [&](const TensorView& xc, const TensorView& Wc) {
        cublas_gemm(output(out), matrix(xc), matrix(Wc, /*transposed=*/true), accumulate, scale);
      }))
    return;
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
  if (gemm_on_cuda(op, dx, dy, W, [&](const TensorView& dyc, const TensorView& Wc) {
        cublas_gemm(output(dx), matrix(dyc), matrix(Wc), accumulate, scale);
      }))
    return;
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
  if (gemm_on_cuda(op, dW, dy, x, [&](const TensorView& dyc, const TensorView& xc) {
        cublas_gemm(output(dW), matrix(dyc, /*transposed=*/true), matrix(xc), accumulate, scale);
      }))
    return;
  gemm(output(dW), matrix(dy, /*transposed=*/true), matrix(x), accumulate, scale);
}

}  // namespace fsdpq
