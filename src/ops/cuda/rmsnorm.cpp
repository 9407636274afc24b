// RMSNorm on the GPU (kernels/rmsnorm.cuh); ops/rmsnorm.cpp checks its arguments and holds the CPU
// reference.
#include "kernels/rmsnorm.cuh"
#include "ops/cuda/kernel_args.h"
#include "ops/cuda_ops.h"

namespace fsdpq::cuda_ops {

void rmsnorm_forward(TensorView y, TensorView rstd, const TensorView& x, const TensorView& weight, float eps) {
  constexpr const char* op = "rmsnorm_forward";
  // The vectorized row kernel where the row fits it (no residual: x is read, not written).
  if (y.dtype == x.dtype && cuda::rmsnorm_rows_fit(weight.shape[0], {y.data, x.data, weight.data})) {
    cuda::residual_rmsnorm_forward(const_cast<void*>(x.data), ktype(op, x), y.data, ktype(op, y), rstd.as<float>(),
                                   nullptr, weight.data, ktype(op, weight), x.shape.rows(), weight.shape[0], eps,
                                   cuda::stream());
    return;
  }
  cuda::rmsnorm_forward(y.data, ktype(op, y), rstd.as<float>(), x.data, ktype(op, x), weight.data, ktype(op, weight),
                        x.shape.rows(), weight.shape[0], eps, cuda::stream());
}

void rmsnorm_backward(TensorView dx, TensorView dweight, const TensorView& dy, const TensorView& x,
                      const TensorView& weight, const TensorView& rstd) {
  constexpr const char* op = "rmsnorm_backward";
  const int64_t rows = x.shape.rows(), channels = weight.shape[0];
  const bool with_dweight = dweight.data != nullptr;
  // Per-row-chunk dweight partials (deterministic: summed in chunk order by a second kernel).
  Tensor workspace =
      with_dweight ? Tensor::empty(Shape{cuda::rmsnorm_backward_workspace(rows, channels)}, DType::F32, Device::CUDA)
                   : Tensor();
  cuda::rmsnorm_backward(dx.data, ktype(op, dx), with_dweight ? dweight.as<float>() : nullptr, dy.data, ktype(op, dy),
                         x.data, ktype(op, x), weight.data, ktype(op, weight), rstd.as<const float>(), rows, channels,
                         with_dweight ? workspace.data<float>() : nullptr, cuda::stream());
}

bool residual_rmsnorm_forward(TensorView x2, TensorView y, TensorView rstd, const TensorView& residual,
                              const TensorView& weight, float eps) {
  constexpr const char* op = "residual_rmsnorm_forward";
  if (y.dtype != x2.dtype || residual.dtype != x2.dtype ||
      !cuda::rmsnorm_rows_fit(weight.shape[0], {x2.data, y.data, residual.data, weight.data}))
    return false;
  cuda::residual_rmsnorm_forward(x2.data, ktype(op, x2), y.data, ktype(op, y), rstd.as<float>(), residual.data,
                                 weight.data, ktype(op, weight), x2.shape.rows(), weight.shape[0], eps, cuda::stream());
  return true;
}

bool rmsnorm_backward_add(TensorView d_acc, const TensorView& dy, const TensorView& x, const TensorView& weight,
                          const TensorView& rstd) {
  constexpr const char* op = "rmsnorm_backward_add";
  if (dy.dtype != x.dtype || d_acc.dtype != x.dtype ||
      !cuda::rmsnorm_rows_fit(weight.shape[0], {d_acc.data, dy.data, x.data, weight.data}))
    return false;
  cuda::rmsnorm_backward_add(d_acc.data, ktype(op, d_acc), dy.data, ktype(op, dy), x.data, ktype(op, x), weight.data,
                             ktype(op, weight), rstd.as<const float>(), x.shape.rows(), weight.shape[0], cuda::stream());
  return true;
}

}  // namespace fsdpq::cuda_ops
