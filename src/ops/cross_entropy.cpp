#include "ops/cross_entropy.h"

#include "backend/cuda_backend.h"

#include "ops/checks.h"
#include "ops/cross_entropy_targets.h"
#include "ops/cuda_ops.h"
#include "ops/dispatch.h"
#include "ops/parallel.h"
#include "ops/storage.h"
#include "util/error.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace fsdpq {

namespace {

void check_labels(const char* op, const TensorView& labels, int64_t B, int64_t T) {
  check_cpu_dtype(op, "labels", labels, DType::I32);
  check_numel(op, "labels", labels, B * T);
}

}  // namespace

int64_t cross_entropy_count_targets(const TensorView& labels, int64_t B, int64_t T) {
  if (labels.device == Device::CUDA) {  // small: count a host copy
    const Tensor host = copy_to(labels, Device::CPU);
    return cross_entropy_count_targets(host.view(), B, T);
  }
  check_labels("cross_entropy_count_targets", labels, B, T);
  const int32_t* label = labels.as<const int32_t>();
  int64_t count = 0;
  for (int64_t row = 0; row < B * T; ++row) count += shifted_target(label, row, T) != kIgnoreIndex;
  return count;
}

namespace {

// The CPU reference's rows: row_loss[row] (fp32; 0 for rows that do not count) and dlogits, for
// labels already checked (check_label_range).
void cpu_rows(const TensorView& logits, const int32_t* label, int64_t rows, int64_t T, TensorView dlogits,
              float grad_scale, float* row_loss) {
  constexpr const char* op = "cross_entropy_forward_backward";
  const int64_t V = logits.shape.last();
  with_storages({logits.dtype, dlogits.dtype}, op, [&](auto in_tag, auto out_tag) {
    using InT = decltype(in_tag);
    using OutT = decltype(out_tag);
#pragma omp parallel if (worth_parallel(rows * V))
    {
      std::vector<float> values(static_cast<size_t>(V));  // this thread's one fp32 row
#pragma omp for schedule(static)
      for (int64_t row = 0; row < rows; ++row) {
        const int32_t target = shifted_target(label, row, T);
        OutT* grad = dlogits.as<OutT>() + row * V;
        if (target == kIgnoreIndex) {
          std::fill(grad, grad + V, from_f32<OutT>(0.0f));
          row_loss[row] = 0.0f;
          continue;
        }
        const InT* in = logits.as<const InT>() + row * V;
        float max_value = -std::numeric_limits<float>::infinity();
        for (int64_t i = 0; i < V; ++i) {
          values[static_cast<size_t>(i)] = to_f32(in[i]);
          max_value = std::max(max_value, values[static_cast<size_t>(i)]);
        }
        float sum = 0.0f;
        for (int64_t i = 0; i < V; ++i) sum += std::exp(values[static_cast<size_t>(i)] - max_value);
        const float log_sum = std::log(sum);
        row_loss[row] = max_value + log_sum - values[static_cast<size_t>(target)];
        // softmax_i = exp(v_i - max - log_sum); written after the row was read, so grad may alias in.
        for (int64_t i = 0; i < V; ++i) {
          const float p = std::exp(values[static_cast<size_t>(i)] - max_value - log_sum);
          grad[i] = from_f32<OutT>(grad_scale * (i == target ? p - 1.0f : p));
        }
      }
    }
  });
}

void check_rows_arguments(const char* op, const TensorView& logits, const TensorView& labels, int64_t B, int64_t T,
                          const TensorView& dlogits) {
  check_float(op, "logits", logits);
  check_float(op, "dlogits", dlogits);
  check_that(labels.dtype == DType::I32, "{}: labels is {}; expected I32", op, labels.describe());
  check_numel(op, "labels", labels, B * T);
  check_that(logits.shape.rows() == B * T, "{}: logits {} do not have B*T = {}*{} rows", op,
             logits.shape.to_string(), B, T);
  check_shape(op, "dlogits", dlogits, logits.shape);
}

}  // namespace

CrossEntropyResult cross_entropy_forward_backward(const TensorView& logits, const TensorView& labels, int64_t B,
                                                  int64_t T, TensorView dlogits, float grad_scale) {
  constexpr const char* op = "cross_entropy_forward_backward";
  check_rows_arguments(op, logits, labels, B, T, dlogits);
  if (runs_on_cuda(op, {logits, labels, dlogits}))
    if constexpr (kWithCuda) return cuda_ops::cross_entropy_forward_backward(logits, labels, B, T, dlogits, grad_scale);
  check_cpu_float(op, "logits", logits);
  check_cpu_float(op, "dlogits", dlogits);
  check_labels(op, labels, B, T);
  const int64_t V = logits.shape.last(), rows = B * T;
  const int32_t* label = labels.as<const int32_t>();
  check_label_range(label, rows, T, V);

  std::vector<float> row_loss(static_cast<size_t>(rows), 0.0f);
  cpu_rows(logits, label, rows, T, dlogits, grad_scale, row_loss.data());
  CrossEntropyResult result;
  for (int64_t row = 0; row < rows; ++row) {
    if (shifted_target(label, row, T) == kIgnoreIndex) continue;
    result.loss_sum += static_cast<double>(row_loss[static_cast<size_t>(row)]);
    ++result.count;
  }
  return result;
}

void cross_entropy_rows_forward_backward(const TensorView& logits, const TensorView& host_labels,
                                         const TensorView& labels, int64_t B, int64_t T, TensorView dlogits,
                                         float grad_scale, TensorView row_loss) {
  constexpr const char* op = "cross_entropy_rows_forward_backward";
  check_rows_arguments(op, logits, labels, B, T, dlogits);
  check_labels(op, host_labels, B, T);  // on the host: the range check reads them
  check_dtype(op, "row_loss", row_loss, DType::F32);
  check_numel(op, "row_loss", row_loss, B * T);
  check_label_range(host_labels.as<const int32_t>(), B * T, T, logits.shape.last());
  if (runs_on_cuda(op, {logits, labels, dlogits, row_loss}))
    if constexpr (kWithCuda) return cuda_ops::cross_entropy_rows_forward_backward(logits, labels, B, T, dlogits, grad_scale, row_loss);
  check_cpu_float(op, "logits", logits);
  check_cpu_float(op, "dlogits", dlogits);
  check_labels(op, labels, B, T);
  cpu_rows(logits, labels.as<const int32_t>(), B * T, T, dlogits, grad_scale, row_loss.as<float>());
}

}  // namespace fsdpq
