#include "ops/elementwise.h"

#include "ops/checks.h"
#include "ops/parallel.h"
#include "ops/storage.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#ifdef FSDPQ_WITH_CUDA
#include "kernels/elementwise.cuh"
#include "ops/cuda_dispatch.h"
#endif

namespace fsdpq {

namespace {

// A CUDA operand in a build without the CUDA backend.
[[maybe_unused]] [[noreturn]] void no_cuda(const char* op) {
  throw std::logic_error(std::string(op) + ": a CUDA tensor, but fsdpq was built without CUDA");
}

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
  with_storage(out.dtype, op, [&](auto out_tag) {
    with_storage(in.dtype, op, [&](auto in_tag) {
      body(out.as<decltype(out_tag)>(), in.as<const decltype(in_tag)>(), out.numel());
    });
  });
}

}  // namespace

void residual_add(TensorView out, const TensorView& a, const TensorView& b) {
  constexpr const char* op = "residual_add";
  check_float(op, "b", b);
  check_numel(op, "b", b, out.numel());
  check_unary(op, out, a);
  if (runs_on_cuda(op, {out, a, b})) {
#ifdef FSDPQ_WITH_CUDA
    cuda::residual_add(out.data, ktype(op, out), a.data, ktype(op, a), b.data, ktype(op, b), out.numel(), cuda::stream());
    return;
#else
    no_cuda(op);
#endif
  }
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
  if (runs_on_cuda(op, {x})) {
#ifdef FSDPQ_WITH_CUDA
    cuda::scale_in_place(x.data, ktype(op, x), factor, x.numel(), cuda::stream());
    return;
#else
    no_cuda(op);
#endif
  }
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
  if (runs_on_cuda(op, {dst, src})) {
#ifdef FSDPQ_WITH_CUDA
    cuda::accumulate(dst.as<float>(), src.data, ktype(op, src), dst.numel(), cuda::stream());
    return;
#else
    no_cuda(op);
#endif
  }
  check_dtype(op, "dst", dst, DType::F32);
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
  if (runs_on_cuda(op, {y, x})) {
#ifdef FSDPQ_WITH_CUDA
    cuda::add_scaled(y.data, ktype(op, y), x.data, ktype(op, x), factor, y.numel(), cuda::stream());
    return;
#else
    no_cuda(op);
#endif
  }
  unary("add_scaled", y, x, [&](auto* out, const auto* in, int64_t n) {
    using YT = std::remove_pointer_t<decltype(out)>;
#pragma omp parallel for if (worth_parallel(n)) schedule(static)
    for (int64_t i = 0; i < n; ++i) out[i] = from_f32<YT>(to_f32(out[i]) + factor * to_f32(in[i]));
  });
}

void copy_convert(TensorView dst, const TensorView& src) {
  constexpr const char* op = "copy_convert";
  check_unary(op, dst, src);
  if (runs_on_cuda(op, {dst, src})) {
#ifdef FSDPQ_WITH_CUDA
    cuda::copy_convert(dst.data, ktype(op, dst), src.data, ktype(op, src), dst.numel(), cuda::stream());
    return;
#else
    no_cuda(op);
#endif
  }
  unary("copy_convert", dst, src, [&](auto* out, const auto* in, int64_t n) {
    using YT = std::remove_pointer_t<decltype(out)>;
#pragma omp parallel for if (worth_parallel(n)) schedule(static)
    for (int64_t i = 0; i < n; ++i) out[i] = from_f32<YT>(to_f32(in[i]));
  });
}

void fill_zero(TensorView x) {
  if (x.device == Device::CUDA) {
    if (x.numel() == 0) return;
#ifdef FSDPQ_WITH_CUDA
    check_that(x.data != nullptr, "fill_zero: {} has no data", x.describe());
    cuda::fill_zero(x.data, x.nbytes(), cuda::stream());
    return;
#else
    no_cuda("fill_zero");
#endif
  }
  check_that(x.device == Device::CPU, "fill_zero: {} is not on the CPU", x.describe());
  if (x.numel() > 0) std::memset(x.data, 0, x.nbytes());
}

double sum_of_squares(const TensorView& x) {
  constexpr const char* op = "sum_of_squares";
  check_float(op, "x", x);
  if (runs_on_cuda(op, {x})) {
#ifdef FSDPQ_WITH_CUDA
    // fp64 partials per chunk on the GPU, summed there in a fixed order; only the total comes back.
    if (x.numel() == 0) return 0.0;
    Tensor workspace = Tensor::empty(Shape{cuda::sum_of_squares_workspace(x.numel())}, DType::F64, Device::CUDA);
    cuda::sum_of_squares(x.data, ktype(op, x), x.numel(), workspace.data<double>(), cuda::stream());
    double total = 0.0;
    copy_bytes(&total, Device::CPU, workspace.data<double>(), Device::CUDA, sizeof(double));
    return total;
#else
    no_cuda(op);
#endif
  }
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
