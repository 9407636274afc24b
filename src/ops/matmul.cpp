#include "ops/matmul.h"

#include <optional>

#include "backend/section_times.h"
#include "ops/checks.h"
#include "ops/cuda_ops.h"
#include "ops/dispatch.h"
#include "ops/elementwise.h"
#include "ops/gemm.h"

namespace fsdpq {

namespace {

// A matrix view as a gemm operand, optionally transposed.
MatrixOperand matrix(const MatrixView& view, bool transposed = false) {
  const int64_t rows = view.rows(), cols = view.cols(), stride = view.row_stride();
  if (transposed) return MatrixOperand{view.data(), view.tensor.dtype, cols, rows, 1, stride};
  return MatrixOperand{view.data(), view.tensor.dtype, rows, cols, stride, 1};
}

MatrixOutput output(const MatrixView& view) {
  return MatrixOutput{view.data(), view.tensor.dtype, view.rows(), view.cols(), view.row_stride()};
}

void check_columns(const char* op, const char* name, const MatrixView& x) {
  check_that(x.first_column >= 0 && x.cols() >= 0 && x.first_column + x.cols() <= x.row_stride(),
             "{}: {}'s columns [{}, {}) lie outside {}", op, name, x.first_column, x.first_column + x.cols(),
             x.tensor.describe());
}

void check_weight(const char* op, const char* name, const MatrixView& w) {
  check_float(op, name, w.tensor);
  check_that(w.tensor.shape.rank == 2, "{}: {} must be a matrix [out, in], got {}", op, name,
             w.tensor.shape.to_string());
  check_columns(op, name, w);
}

void check_activation(const char* op, const char* name, const MatrixView& x) {
  check_float(op, name, x.tensor);
  check_that(x.tensor.shape.rank >= 1, "{}: {} must have at least one dimension", op, name);
  check_columns(op, name, x);
}

std::string describe(const MatrixView& x) {
  if (x.whole()) return x.tensor.shape.to_string();
  return fmt::format("{} columns [{}, {})", x.tensor.shape.to_string(), x.first_column, x.first_column + x.cols());
}

bool is_half(DType dtype) { return dtype == DType::BF16 || dtype == DType::F16; }

// The one storage type cuBLAS multiplies the inputs in: half precision wins, as under autocast
// (an F32 activation gradient meeting a BF16 weight is multiplied in BF16, like PyTorch's
// bf16 backward; accumulation stays fp32).
DType gpu_operand_dtype(const TensorView& out, const TensorView& p, const TensorView& q) {
  for (DType half : {DType::BF16, DType::F16})
    if (p.dtype == half || q.dtype == half || out.dtype == half) return half;
  return DType::F32;
}

// `view` in `dtype`: itself, or a converted copy (of the whole tensor) kept alive by `storage`.
MatrixView as_dtype(const MatrixView& view, DType dtype, Tensor& storage) {
  if (view.tensor.dtype == dtype) return view;
  storage = Tensor::empty(view.tensor.shape, dtype, view.tensor.device);
  copy_convert(storage, view.tensor);
  return MatrixView(storage.view(), view.first_column, view.columns);
}

// A factor of a product: a matrix view, read transposed or not.
struct Factor {
  MatrixView view;
  bool transposed = false;
};

// out (+)= scale · p·q on the GPU when the operands live there (true), else nothing (false: the
// CPU's gemm follows). cuBLAS multiplies one storage type, so a factor of another is converted.
bool gemm_on_cuda(const char* op, const MatrixView& out, Factor p, Factor q, bool accumulate, float scale) {
  if (!runs_on_cuda(op, {out.tensor, p.view.tensor, q.view.tensor})) return false;
  if constexpr (kWithCuda) {
    const DType dtype = gpu_operand_dtype(out.tensor, p.view.tensor, q.view.tensor);
    check_that(out.tensor.dtype == DType::F32 || out.tensor.dtype == dtype,
               "{}: cannot write {} from {} operands on the GPU", op, out.tensor.describe(), dtype_name(dtype));
    Tensor p_storage, q_storage;
    const MatrixView pc = as_dtype(p.view, dtype, p_storage), qc = as_dtype(q.view, dtype, q_storage);
    cuda_ops::gemm(output(out), matrix(pc, p.transposed), matrix(qc, q.transposed), accumulate, scale);
  }
  return true;
}

}  // namespace

TensorView round_for_gemms(const TensorView& x, std::initializer_list<DType> weight_dtypes, Tensor& storage,
                           const char* section) {
  const DType half = *weight_dtypes.begin();
  if (x.device == Device::CPU || x.dtype != DType::F32 || !is_half(half)) return x;
  for (DType dtype : weight_dtypes)
    if (dtype != half) return x;  // the GEMMs would round x to different types
  std::optional<ScopedSection> timed;
  if (section != nullptr) timed.emplace(section);
  storage = Tensor::empty(x.shape, half, x.device);
  copy_convert(storage, x);
  return storage.view();
}

void linear_forward(const MatrixView& out, const MatrixView& x, const MatrixView& W, bool accumulate, float scale) {
  constexpr const char* op = "linear_forward";
  check_activation(op, "x", x);
  check_activation(op, "out", out);
  check_weight(op, "W", W);
  check_that(x.cols() == W.cols() && out.cols() == W.rows() && out.rows() == x.rows(),
             "{}: out {} = x {} · W {}ᵀ does not fit", op, describe(out), describe(x), describe(W));
  if (gemm_on_cuda(op, out, {x}, {W, /*transposed=*/true}, accumulate, scale)) return;
  gemm(output(out), matrix(x), matrix(W, /*transposed=*/true), accumulate, scale);
}

void linear_backward_input(const MatrixView& dx, const MatrixView& dy, const MatrixView& W, bool accumulate,
                           float scale) {
  constexpr const char* op = "linear_backward_input";
  check_activation(op, "dx", dx);
  check_activation(op, "dy", dy);
  check_weight(op, "W", W);
  check_that(dy.cols() == W.rows() && dx.cols() == W.cols() && dx.rows() == dy.rows(),
             "{}: dx {} = dy {} · W {} does not fit", op, describe(dx), describe(dy), describe(W));
  if (gemm_on_cuda(op, dx, {dy}, {W}, accumulate, scale)) return;
  gemm(output(dx), matrix(dy), matrix(W), accumulate, scale);
}

void linear_backward_weight(TensorView dW, const MatrixView& dy, const MatrixView& x, bool accumulate, float scale) {
  constexpr const char* op = "linear_backward_weight";
  check_weight(op, "dW", dW);
  check_activation(op, "dy", dy);
  check_activation(op, "x", x);
  check_that(dW.shape[0] == dy.cols() && dW.shape[1] == x.cols() && dy.rows() == x.rows(),
             "{}: dW {} = dy {}ᵀ · x {} does not fit", op, dW.shape.to_string(), describe(dy), describe(x));
  if (gemm_on_cuda(op, dW, {dy, /*transposed=*/true}, {x}, accumulate, scale)) return;
  gemm(output(dW), matrix(dy, /*transposed=*/true), matrix(x), accumulate, scale);
}

}  // namespace fsdpq
