// The fused cross entropy on the GPU (kernels/cross_entropy.cuh); ops/cross_entropy.cpp checks the
// arguments and holds the CPU reference.
#include "kernels/cross_entropy.cuh"
#include "ops/cross_entropy_targets.h"
#include "ops/cuda/kernel_args.h"
#include "ops/cuda_ops.h"

namespace fsdpq::cuda_ops {

CrossEntropyResult cross_entropy_forward_backward(const TensorView& logits, const TensorView& labels, int64_t B,
                                                  int64_t T, TensorView dlogits, float grad_scale) {
  constexpr const char* op = "cross_entropy_forward_backward";
  // The labels come to the host (small) for the range check and the count; the per-row fp32
  // losses come back and are summed in row order in double, as the CPU does.
  const int64_t V = logits.shape.last(), rows = B * T;
  const Tensor host_labels = copy_to(labels, Device::CPU);
  const int32_t* label = host_labels.data<int32_t>();
  check_label_range(label, rows, T, V);
  Tensor row_loss = Tensor::empty(Shape{rows}, DType::F32, Device::CUDA);
  cuda::cross_entropy_forward_backward(logits.data, ktype(op, logits), labels.as<const int32_t>(), rows, T, V,
                                       dlogits.data, ktype(op, dlogits), grad_scale, row_loss.data<float>(),
                                       cuda::stream());
  const Tensor losses = copy_to(row_loss, Device::CPU);
  const float* loss = losses.data<float>();
  CrossEntropyResult result;
  for (int64_t row = 0; row < rows; ++row) {
    if (shifted_target(label, row, T) == kIgnoreIndex) continue;
    result.loss_sum += static_cast<double>(loss[row]);
    ++result.count;
  }
  return result;
}

void cross_entropy_rows_forward_backward(const TensorView& logits, const TensorView& labels, int64_t B, int64_t T,
                                         TensorView dlogits, float grad_scale, TensorView row_loss) {
  constexpr const char* op = "cross_entropy_rows_forward_backward";
  cuda::cross_entropy_forward_backward(logits.data, ktype(op, logits), labels.as<const int32_t>(), B * T, T,
                                       logits.shape.last(), dlogits.data, ktype(op, dlogits), grad_scale,
                                       row_loss.as<float>(), cuda::stream());
}

}  // namespace fsdpq::cuda_ops
