#include "ops/elementwise.h"

#include "ops/checks.h"
#include "ops/cuda_ops.h"
#include "ops/dispatch.h"
#include "ops/parallel.h"
#include "ops/storage.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace fsdpq {

namespace {

// The device-agnostic checks of unary() below, made before the op picks its implementation.
void check_unary(const char* op, const TensorView& out, const TensorView& in) {
  check_float(op, "output", out);
  check_float(op, "input", in);
  check_numel(op, "input", in, out.numel());
}

// Runs body(out_ptr, in_ptr, n) with the storage types of out and in resolved.
template <class Body>
void unary(const char* op, TensorView out, const TensorView& in, Body&& body) {
  check_cpu_float(op, "output", out);
  check_cpu_float(op, "input", in);
  check_numel(op, "input", in, out.numel());
  with_storages({out.dtype, in.dtype}, op, [&](auto out_tag, auto in_tag) {
    body(out.as<decltype(out_tag)>(), in.as<const decltype(in_tag)>(), out.numel());
  });
}

}  // namespace

void residual_add(TensorView out, const TensorView& a, const TensorView& b) {
  constexpr const char* op = "residual_add";
  check_float(op, "b", b);
  check_numel(op, "b", b, out.numel());
  check_unary(op, out, a);
  if (runs_on_cuda(op, {out, a, b}))
    if constexpr (kWithCuda) return cuda_ops::residual_add(out, a, b);
  check_cpu_float(op, "b", b);
  unary(op, out, a, [&](auto* y, const auto* x, int64_t n) {
    using YT = std::remove_pointer_t<decltype(y)>;
    with_storage(b.dtype, op, [&](auto b_tag) {
      const auto* z = b.as<const decltype(b_tag)>();
#pragma omp parallel for if (worth_parallel(n)) schedule(static)
      for (int64_t i = 0; i < n; ++i) y[i] = from_f32<YT>(to_f32(x[i]) + to_f32(z[i]));
    });
  });
}

void scale_in_place(TensorView x, float factor) {
  constexpr const char* op = "scale_in_place";
  check_unary(op, x, x);
  if (runs_on_cuda(op, {x}))
    if constexpr (kWithCuda) return cuda_ops::scale_in_place(x, factor);
  unary("scale_in_place", x, x, [&](auto* y, const auto* in, int64_t n) {
    using YT = std::remove_pointer_t<decltype(y)>;
#pragma omp parallel for if (worth_parallel(n)) schedule(static)
    for (int64_t i = 0; i < n; ++i) y[i] = from_f32<YT>(to_f32(in[i]) * factor);
  });
}

void accumulate(TensorView dst, const TensorView& src) {
  constexpr const char* op = "accumulate";
  check_that(dst.dtype == DType::F32, "{}: dst is {}; expected F32", op, dst.describe());
  check_float(op, "src", src);
  check_numel(op, "src", src, dst.numel());
  if (runs_on_cuda(op, {dst, src}))
    if constexpr (kWithCuda) return cuda_ops::accumulate(dst, src);
  check_cpu_dtype(op, "dst", dst, DType::F32);
  check_cpu_float(op, "src", src);
  check_numel(op, "src", src, dst.numel());
  float* y = dst.as<float>();
  const int64_t n = dst.numel();
  with_storage(src.dtype, op, [&](auto tag) {
    const auto* x = src.as<const decltype(tag)>();
#pragma omp parallel for if (worth_parallel(n)) schedule(static)
    for (int64_t i = 0; i < n; ++i) y[i] += to_f32(x[i]);
  });
}

void add_scaled(TensorView y, const TensorView& x, float factor) {
  constexpr const char* op = "add_scaled";
  check_unary(op, y, x);
  if (runs_on_cuda(op, {y, x}))
    if constexpr (kWithCuda) return cuda_ops::add_scaled(y, x, factor);
  unary("add_scaled", y, x, [&](auto* out, const auto* in, int64_t n) {
    using YT = std::remove_pointer_t<decltype(out)>;
#pragma omp parallel for if (worth_parallel(n)) schedule(static)
    for (int64_t i = 0; i < n; ++i) out[i] = from_f32<YT>(to_f32(out[i]) + factor * to_f32(in[i]));
  });
}

void copy_convert(TensorView dst, const TensorView& src) {
  constexpr const char* op = "copy_convert";
  check_unary(op, dst, src);
  if (runs_on_cuda(op, {dst, src}))
    if constexpr (kWithCuda) return cuda_ops::copy_convert(dst, src);
  unary("copy_convert", dst, src, [&](auto* out, const auto* in, int64_t n) {
    using YT = std::remove_pointer_t<decltype(out)>;
#pragma omp parallel for if (worth_parallel(n)) schedule(static)
    for (int64_t i = 0; i < n; ++i) out[i] = from_f32<YT>(to_f32(in[i]));
  });
}

namespace {

// copy_block's and copy_blocks' checks of one block copy.
void check_block_copy(const char* op, const MatrixView& dst, const MatrixView& src) {
  check_float(op, "dst", dst.tensor);
  check_float(op, "src", src.tensor);
  for (const MatrixView* m : {&dst, &src})
    check_that(m->first_column >= 0 && m->cols() >= 0 && m->first_column + m->cols() <= m->row_stride(),
               "{}: columns [{}, {}) lie outside {}", op, m->first_column, m->first_column + m->cols(),
               m->tensor.describe());
  check_that(dst.rows() == src.rows() && dst.cols() == src.cols(), "{}: dst [{}, {}] and src [{}, {}] differ", op,
             dst.rows(), dst.cols(), src.rows(), src.cols());
}

}  // namespace

void copy_block(const MatrixView& dst, const MatrixView& src, float scale) {
  constexpr const char* op = "copy_block";
  check_block_copy(op, dst, src);
  if (runs_on_cuda(op, {dst.tensor, src.tensor}))
    if constexpr (kWithCuda) return cuda_ops::copy_block(dst, src, scale);
  with_storages({dst.dtype(), src.dtype()}, op, [&](auto out_tag, auto in_tag) {
    using Y = decltype(out_tag);
    using X = decltype(in_tag);
    const int64_t rows = dst.rows(), cols = dst.cols();
#pragma omp parallel for if (worth_parallel(rows * cols)) schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      Y* out = static_cast<Y*>(dst.data()) + r * dst.row_stride();
      const X* in = static_cast<const X*>(src.data()) + r * src.row_stride();
      for (int64_t c = 0; c < cols; ++c) out[c] = from_f32<Y>(to_f32(in[c]) * scale);
    }
  });
}

void copy_blocks(std::span<const BlockCopy> copies) {
  constexpr const char* op = "copy_blocks";
  std::vector<BlockCopy> device_copies;
  for (const BlockCopy& c : copies) {
    check_block_copy(op, c.dst, c.src);
    if (runs_on_cuda(op, {c.dst.tensor, c.src.tensor}))
      device_copies.push_back(c);
    else
      copy_block(c.dst, c.src, c.scale);
  }
  if (device_copies.empty()) return;
  if constexpr (kWithCuda) cuda_ops::copy_blocks(device_copies);
}

void fill_zero(TensorView x) {
  constexpr const char* op = "fill_zero";
  if (x.numel() == 0) return;
  check_that(x.data != nullptr, "{}: {} has no data", op, x.describe());
  if (runs_on_cuda(op, {x}))
    if constexpr (kWithCuda) return cuda_ops::fill_zero(x);
  std::memset(x.data, 0, x.nbytes());
}

double sum_of_squares(const TensorView& x) {
  constexpr const char* op = "sum_of_squares";
  check_float(op, "x", x);
  if (runs_on_cuda(op, {x}))
    if constexpr (kWithCuda) return cuda_ops::sum_of_squares(x);
  check_cpu_float(op, "x", x);
  // Fixed-size chunks summed in order: the result does not depend on the thread count.
  constexpr int64_t kChunk = 4096;
  const int64_t n = x.numel(), chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(static_cast<size_t>(chunks), 0.0);
  with_storage(x.dtype, op, [&](auto tag) {
    const auto* v = x.as<const decltype(tag)>();
#pragma omp parallel for if (worth_parallel(n)) schedule(static)
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {
      double sum = 0.0;
      for (int64_t i = chunk * kChunk; i < std::min(n, (chunk + 1) * kChunk); ++i) {
        const double d = to_f32(v[i]);
        sum += d * d;
      }
      partial[static_cast<size_t>(chunk)] = sum;
    }
  });
  double total = 0.0;
  for (double sum : partial) total += sum;
  return total;
}

}  // namespace fsdpq
