// RMSNorm on the GPU (kernels/rmsnorm.cuh); ops/rmsnorm.cpp checks its arguments and holds the CPU
// reference.
#include "kernels/rmsnorm.cuh"
#include "ops/cuda/kernel_args.h"
#include "ops/cuda_ops.h"

namespace fsdpq::cuda_ops {

void rmsnorm_forward(TensorView y, TensorView rstd, const TensorView& x, const TensorView& weight, float eps) {
  constexpr const char* op = "rmsnorm_forward";
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

}  // namespace fsdpq::cuda_ops
