#include "ops/elementwise.h"

#include "ops/checks.h"
#include "ops/parallel.h"
#include "ops/storage.h"

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

namespace fsdpq {

namespace {

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
  check_cpu_float(op, "b", b);
  check_numel(op, "b", b, out.numel());
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
  unary("scale_in_place", x, x, [&](auto* y, const auto* in, int64_t n) {
    using YT = std::remove_pointer_t<decltype(y)>;
#pragma omp parallel for if (worth_parallel(n)) schedule(static)
    for (int64_t i = 0; i < n; ++i) y[i] = from_f32<YT>(to_f32(in[i]) * factor);
  });
}

void accumulate(TensorView dst, const TensorView& src) {
  constexpr const char* op = "accumulate";
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
  unary("add_scaled", y, x, [&](auto* out, const auto* in, int64_t n) {
    using YT = std::remove_pointer_t<decltype(out)>;
#pragma omp parallel for if (worth_parallel(n)) schedule(static)
    for (int64_t i = 0; i < n; ++i) out[i] = from_f32<YT>(to_f32(out[i]) + factor * to_f32(in[i]));
  });
}

void copy_convert(TensorView dst, const TensorView& src) {
  unary("copy_convert", dst, src, [&](auto* out, const auto* in, int64_t n) {
    using YT = std::remove_pointer_t<decltype(out)>;
#pragma omp parallel for if (worth_parallel(n)) schedule(static)
    for (int64_t i = 0; i < n; ++i) out[i] = from_f32<YT>(to_f32(in[i]));
  });
}

void fill_zero(TensorView x) {
  check_that(x.device == Device::CPU, "fill_zero: {} is not on the CPU", x.describe());
  if (x.numel() > 0) std::memset(x.data, 0, x.nbytes());
}

double sum_of_squares(const TensorView& x) {
  constexpr const char* op = "sum_of_squares";
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
