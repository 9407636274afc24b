#include "optim/device_grads.h"

#include <fmt/format.h>

#include <stdexcept>
#include <vector>

#include "backend/cuda_backend.h"

#ifdef FSDPQ_WITH_CUDA
#include "kernels/reduce.cuh"
#endif

namespace fsdpq {
namespace {

#ifdef FSDPQ_WITH_CUDA
void check_size(const char* what, int64_t n) {
  if (n < 0) throw std::logic_error(fmt::format("{}: negative size {}", what, n));
}
#endif

}  // namespace

double device_grad_sq_sum(const float* d, int64_t n) {
  const GradBuffer one{const_cast<float*>(d), n};
  return device_grad_sq_sum(std::span<const GradBuffer>(&one, 1));
}

double device_grad_sq_sum(std::span<const GradBuffer> grads) {
#ifdef FSDPQ_WITH_CUDA
  int64_t chunks = 0;
  for (const GradBuffer& g : grads) {
    check_size("device_grad_sq_sum", g.numel);
    chunks += cuda::sum_of_squares_chunks(g.numel);
  }
  if (chunks == 0) return 0.0;
  // Every buffer's partials side by side in one scratch buffer, copied back once.
  Tensor scratch = Tensor::empty({chunks}, DType::F64, Device::CUDA);
  double* partials = scratch.data<double>();
  int64_t at = 0;
  for (const GradBuffer& g : grads) {
    cuda::sum_of_squares_partials(g.data, g.numel, partials + at, cuda::stream());
    at += cuda::sum_of_squares_chunks(g.numel);
  }
  std::vector<double> host(static_cast<size_t>(chunks));
  copy_bytes(host.data(), Device::CPU, partials, Device::CUDA, host.size() * sizeof(double));
  // clip.cpp's order: per buffer, 0 + its partials left to right; then 0 + the buffer sums.
  double total = 0.0;
  size_t k = 0;
  for (const GradBuffer& g : grads) {
    double sum = 0.0;
    for (int64_t c = cuda::sum_of_squares_chunks(g.numel); c > 0; --c) sum += host[k++];
    total += sum;
  }
  return total;
#else
  no_cuda("device_grad_sq_sum");
#endif
}

void device_scale(float* d, int64_t n, float f) {
#ifdef FSDPQ_WITH_CUDA
  check_size("device_scale", n);
  cuda::scale(d, n, f, cuda::stream());
#else
  no_cuda("device_scale");
#endif
}

bool device_unscale(float* d, int64_t n, const DynamicLossScaler& scaler) {
  const GradBuffer one{d, n};
  return device_unscale(std::span<const GradBuffer>(&one, 1), scaler);
}

bool device_unscale(std::span<const GradBuffer> grads, const DynamicLossScaler& scaler) {
#ifdef FSDPQ_WITH_CUDA
  const float inv = scaler.inv_scale();  // fp32(1 / scale), multiplied in, as the CPU does
  Tensor found = Tensor::zeros({1}, DType::I32, Device::CUDA);
  for (const GradBuffer& g : grads) {
    check_size("device_unscale", g.numel);
    cuda::unscale_and_check(g.data, g.numel, inv, found.data<int32_t>(), cuda::stream());
  }
  int32_t host = 0;
  copy_bytes(&host, Device::CPU, found.data<int32_t>(), Device::CUDA, sizeof host);
  return host != 0;
#else
  no_cuda("device_unscale");
#endif
}

void device_fill_zero(float* d, int64_t n) {
#ifdef FSDPQ_WITH_CUDA
  check_size("device_fill_zero", n);
  cuda::fill(d, n, 0.0f, cuda::stream());
#else
  no_cuda("device_fill_zero");
#endif
}

}  // namespace fsdpq
