#include "ops/rmsnorm.h"

#include "ops/checks.h"
#include "ops/cuda_ops.h"
#include "ops/dispatch.h"
#include "ops/elementwise.h"
#include "ops/parallel.h"
#include "ops/storage.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace fsdpq {

namespace {

// Eight partial sums let the compiler vectorise a reduction it may not reorder itself.
template <class T>
float sum_of_squares(const T* row, int64_t n) {
  float partial[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int lane = 0; lane < 8; ++lane) {
      float v = to_f32(row[i + lane]);
      partial[lane] += v * v;
    }
  for (; i < n; ++i) {
    float v = to_f32(row[i]);
    partial[0] += v * v;
  }
  return ((partial[0] + partial[1]) + (partial[2] + partial[3])) + ((partial[4] + partial[5]) + (partial[6] + partial[7]));
}

struct RowLayout {
  int64_t rows, channels;
};

// The checks made before the op picks its device (runs_on_cuda then ensures one device for all).
RowLayout check_common(const char* op, const TensorView& x, const TensorView& weight, const TensorView& rstd) {
  check_float(op, "x", x);
  check_float(op, "weight", weight);
  check_that(rstd.dtype == DType::F32, "{}: rstd is {}; expected F32", op, rstd.describe());
  check_that(weight.shape.rank == 1 && x.shape.rank >= 1 && x.shape.last() == weight.shape[0],
             "{}: weight {} does not match the last dimension of x {}", op, weight.shape.to_string(),
             x.shape.to_string());
  RowLayout layout{x.shape.rows(), weight.shape[0]};
  check_numel(op, "rstd", rstd, layout.rows);
  return layout;
}

}  // namespace

void rmsnorm_forward(TensorView y, TensorView rstd, const TensorView& x, const TensorView& weight, float eps) {
  constexpr const char* op = "rmsnorm_forward";
  const RowLayout layout = check_common(op, x, weight, rstd);
  check_float(op, "y", y);
  check_shape(op, "y", y, x.shape);
  if (runs_on_cuda(op, {y, rstd, x, weight}))
    if constexpr (kWithCuda) return cuda_ops::rmsnorm_forward(y, rstd, x, weight, eps);
  float* rstd_out = rstd.as<float>();

  with_storages({x.dtype, weight.dtype, y.dtype}, op, [&](auto x_tag, auto w_tag, auto y_tag) {
    using XT = decltype(x_tag);
    using WT = decltype(w_tag);
    using YT = decltype(y_tag);
    const XT* xs = x.as<const XT>();
    const WT* w = weight.as<const WT>();
    YT* ys = y.as<YT>();
    const int64_t C = layout.channels;
#pragma omp parallel for if (worth_parallel(layout.rows * C)) schedule(static)
    for (int64_t r = 0; r < layout.rows; ++r) {
      const XT* x_row = xs + r * C;
      YT* y_row = ys + r * C;
      const float variance = sum_of_squares(x_row, C) / static_cast<float>(C);
      const float inv_rms = 1.0f / std::sqrt(variance + eps);
      rstd_out[r] = inv_rms;
      for (int64_t c = 0; c < C; ++c) {
        const float normalized = round_to<XT>(to_f32(x_row[c]) * inv_rms);  // n.to(input_dtype)
        y_row[c] = from_f32<YT>(to_f32(w[c]) * normalized);
      }
    }
  });
}

void rmsnorm_backward(TensorView dx, TensorView dweight, const TensorView& dy, const TensorView& x,
                      const TensorView& weight, const TensorView& rstd) {
  constexpr const char* op = "rmsnorm_backward";
  const RowLayout layout = check_common(op, x, weight, rstd);
  check_float(op, "dy", dy);
  check_float(op, "dx", dx);
  check_shape(op, "dy", dy, x.shape);
  check_shape(op, "dx", dx, x.shape);
  const bool with_dweight = dweight.data != nullptr;
  if (with_dweight) {
    check_that(dweight.dtype == DType::F32, "{}: dweight is {}; expected F32", op, dweight.describe());
    check_shape(op, "dweight", dweight, weight.shape);
  }
  if (runs_on_cuda(op, {dx, dweight, dy, x, weight, rstd}))
    if constexpr (kWithCuda) return cuda_ops::rmsnorm_backward(dx, dweight, dy, x, weight, rstd);
  const float* inv_rms = rstd.as<const float>();
  float* dw = dweight.as<float>();

  with_storages({x.dtype, weight.dtype, dy.dtype, dx.dtype}, op, [&](auto x_tag, auto w_tag, auto dy_tag, auto dx_tag) {
    using XT = decltype(x_tag);
    using WT = decltype(w_tag);
    using DYT = decltype(dy_tag);
    using DXT = decltype(dx_tag);
    const XT* xs = x.as<const XT>();
    const WT* w = weight.as<const WT>();
    const DYT* dys = dy.as<const DYT>();
    DXT* dxs = dx.as<DXT>();
    const int64_t C = layout.channels, rows = layout.rows;

    // dweight first: dx may alias dy, and dweight needs dy. Threads own column blocks
    // (rows are summed in order), so the result is deterministic.
    constexpr int64_t kColumnBlock = 64;
    const int64_t blocks = with_dweight ? (C + kColumnBlock - 1) / kColumnBlock : 0;
#pragma omp parallel for if (worth_parallel(rows * C)) schedule(static)
    for (int64_t block = 0; block < blocks; ++block) {
      const int64_t c0 = block * kColumnBlock, c1 = std::min(C, c0 + kColumnBlock);
      float sums[kColumnBlock] = {};
      for (int64_t r = 0; r < rows; ++r) {
        const XT* x_row = xs + r * C;
        const DYT* dy_row = dys + r * C;
        for (int64_t c = c0; c < c1; ++c)
          sums[c - c0] += to_f32(dy_row[c]) * round_to<XT>(to_f32(x_row[c]) * inv_rms[r]);
      }
      for (int64_t c = c0; c < c1; ++c) dw[c] += sums[c - c0];
    }

    // With n = x * rstd and g = dy * weight: dx = rstd * (g - n * mean(g * n)).
#pragma omp parallel for if (worth_parallel(rows * C)) schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const XT* x_row = xs + r * C;
      const DYT* dy_row = dys + r * C;
      DXT* dx_row = dxs + r * C;
      const float s = inv_rms[r];
      float dot = 0.0f;
      for (int64_t c = 0; c < C; ++c) dot += to_f32(dy_row[c]) * to_f32(w[c]) * (to_f32(x_row[c]) * s);
      const float mean_dot = dot / static_cast<float>(C);
      for (int64_t c = 0; c < C; ++c) {
        const float g = to_f32(dy_row[c]) * to_f32(w[c]);
        const float n = to_f32(x_row[c]) * s;
        dx_row[c] = from_f32<DXT>(s * (g - n * mean_dot));
      }
    }
  });
}

void residual_rmsnorm_forward(TensorView x2, TensorView y, TensorView rstd, const TensorView& residual,
                              const TensorView& weight, float eps) {
  constexpr const char* op = "residual_rmsnorm_forward";
  check_common(op, x2, weight, rstd);
  check_float(op, "y", y);
  check_float(op, "residual", residual);
  check_shape(op, "y", y, x2.shape);
  check_shape(op, "residual", residual, x2.shape);
  if (runs_on_cuda(op, {x2, y, rstd, residual, weight}))
    if constexpr (kWithCuda)
      if (cuda_ops::residual_rmsnorm_forward(x2, y, rstd, residual, weight, eps)) return;
  residual_add(x2, residual, x2);
  rmsnorm_forward(y, rstd, x2, weight, eps);
}

void rmsnorm_backward_add(TensorView d_acc, TensorView dweight, TensorView dy, const TensorView& x,
                          const TensorView& weight, const TensorView& rstd) {
  constexpr const char* op = "rmsnorm_backward_add";
  check_common(op, x, weight, rstd);
  check_float(op, "dy", dy);
  check_float(op, "d_acc", d_acc);
  check_shape(op, "dy", dy, x.shape);
  check_shape(op, "d_acc", d_acc, x.shape);
  if (runs_on_cuda(op, {d_acc, dweight, dy, x, weight, rstd}))
    if constexpr (kWithCuda)
      if (dweight.data == nullptr && cuda_ops::rmsnorm_backward_add(d_acc, dy, x, weight, rstd)) return;
  rmsnorm_backward(dy, dweight, dy, x, weight, rstd);
  residual_add(d_acc, d_acc, dy);
}

}  // namespace fsdpq
