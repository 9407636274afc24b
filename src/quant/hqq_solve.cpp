#include "quant/hqq_solve.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string_view>

#include "backend/cuda_backend.h"
#include "util/error.h"
#ifdef FSDPQ_WITH_CUDA
#include "kernels/hqq_solve.cuh"
#endif

namespace fsdpq {
namespace {

std::mutex work_mutex;
HqqSolverWork work_so_far;

void check_request(int64_t count, int updates, int n_bits) {
  if (count < 0) throw std::logic_error(fmt::format("hqq_solve_groups: {} groups", count));
  if (updates < 0 || updates > kHqqSolverIterations)
    throw std::logic_error(fmt::format("hqq_solve_groups: {} updates, expected 0 to {}", updates, kHqqSolverIterations));
  if (!hqq_supported_bits(n_bits)) throw std::logic_error(fmt::format("hqq_solve_groups: {} bits", n_bits));
}

int64_t blocks_of(int64_t count) { return (count + kHqqBlockGroups - 1) / kHqqBlockGroups; }

void solve_on_cpu(const HqqGroupReader& read, int64_t count, int n_bits, int updates, HqqSolverPrecision precision,
                  HqqSolved& out) {
  const bool errors = !out.block_errors.empty();
#pragma omp parallel for schedule(dynamic)
  for (int64_t b = 0; b < blocks_of(count); ++b) {
    double* block = errors ? out.block_errors.data() + b * kHqqSolverIterations : nullptr;
    for (int64_t g = b * kHqqBlockGroups; g < std::min((b + 1) * kHqqBlockGroups, count); ++g) {
      float w[kHqqGroupSize];
      read(g, w);
      out.groups[static_cast<size_t>(g)] = hqq_solve_group(w, hqq_group_start(w, n_bits), n_bits, updates, precision, block);
    }
  }
}

#ifdef FSDPQ_WITH_CUDA
// Chunks of whole statistics blocks, so each chunk's blocks are the request's: 2^18 groups, 64 MiB
// of values on the GPU at a time.
constexpr int64_t kChunkGroups = int64_t{1} << 18;
static_assert(kChunkGroups % kHqqBlockGroups == 0);
static_assert(cuda::kHqqSolveBlockGroups == kHqqBlockGroups);

// The host side of the GPU's chunks, page-locked and kept for the process: copies from pageable
// memory run at a few GB/s (HostStaging), and pinning a chunk per request would cost about what
// it saves. Never freed: the CUDA runtime may be gone when static objects are destroyed. One
// request at a time uses it (staging_mutex).
HostStaging& gpu_staging() {
  static HostStaging* staging = new HostStaging;
  return *staging;
}
std::mutex staging_mutex;

void solve_on_gpu(const HqqGroupReader& read, int64_t count, int n_bits, int updates, HqqSolved& out) {
  const std::lock_guard<std::mutex> lock(staging_mutex);
  const bool errors = !out.block_errors.empty();
  const int64_t chunk = std::min(count, kChunkGroups);
  auto* staged = static_cast<float*>(gpu_staging().reserve(static_cast<size_t>(chunk * kHqqGroupSize) * sizeof(float)));
  Tensor device_values = Tensor::empty(Shape{chunk * kHqqGroupSize}, DType::F32, Device::CUDA);
  Tensor scales = Tensor::empty(Shape{chunk}, DType::F32, Device::CUDA);
  Tensor zeros = Tensor::empty(Shape{chunk}, DType::F32, Device::CUDA);
  Tensor device_errors = Tensor::empty(Shape{errors ? blocks_of(chunk) * kHqqSolverIterations : 1}, DType::F64, Device::CUDA);
  std::vector<float> host_scales(static_cast<size_t>(chunk)), host_zeros(static_cast<size_t>(chunk));
  for (int64_t first = 0; first < count; first += chunk) {
    const int64_t n = std::min(chunk, count - first);
#pragma omp parallel for schedule(static)
    for (int64_t g = 0; g < n; ++g) read(first + g, staged + g * kHqqGroupSize);
    copy_bytes(device_values.view().data, Device::CUDA, staged, Device::CPU,
               static_cast<size_t>(n * kHqqGroupSize) * sizeof(float));
    cuda::hqq_solve(static_cast<const float*>(device_values.view().data), n, n_bits, updates,
                    hqq_half_shrink_powers().data(), static_cast<float*>(scales.view().data),
                    static_cast<float*>(zeros.view().data), errors ? static_cast<double*>(device_errors.view().data) : nullptr,
                    cuda::stream());
    copy_bytes(host_scales.data(), Device::CPU, scales.view().data, Device::CUDA, static_cast<size_t>(n) * sizeof(float));
    copy_bytes(host_zeros.data(), Device::CPU, zeros.view().data, Device::CUDA, static_cast<size_t>(n) * sizeof(float));
    if (errors)
      copy_bytes(out.block_errors.data() + first / kHqqBlockGroups * kHqqSolverIterations, Device::CPU,
                 device_errors.view().data, Device::CUDA,
                 static_cast<size_t>(blocks_of(n) * kHqqSolverIterations) * sizeof(double));
#pragma omp parallel for schedule(static)
    for (int64_t g = 0; g < n; ++g)
      out.groups[static_cast<size_t>(first + g)] = {host_scales[static_cast<size_t>(g)], host_zeros[static_cast<size_t>(g)]};
  }
}
#endif

// FSDPQ_HQQ_SOLVER's choice (runtime/environment.h checked its value at start-up).
HqqSolverDevice device_from_environment() {
  const char* env = std::getenv("FSDPQ_HQQ_SOLVER");
  if (env == nullptr || *env == '\0' || std::string_view(env) == "auto") return HqqSolverDevice::kAuto;
  if (std::string_view(env) == "cpu") return HqqSolverDevice::kCpu;
  if (std::string_view(env) == "gpu") return HqqSolverDevice::kGpu;
  throw UserError(fmt::format("environment: FSDPQ_HQQ_SOLVER = '{}' is not auto, cpu or gpu", env));
}

}  // namespace

HqqSolved hqq_solve_groups(const HqqGroupReader& read, int64_t count, int n_bits, int updates,
                           HqqSolverPrecision precision, bool block_errors, HqqSolverDevice device) {
  check_request(count, updates, n_bits);
  if (device == HqqSolverDevice::kAuto) device = device_from_environment();
  const auto start = std::chrono::steady_clock::now();
  const bool gpu_can = cuda_initialized() && precision == HqqSolverPrecision::kHalf;
  if (device == HqqSolverDevice::kGpu && !gpu_can)
    throw UserError(cuda_initialized() ? "hqq: the GPU solver runs the float16 solver only"
                                       : "hqq: the solver was asked to run on the GPU (FSDPQ_HQQ_SOLVER=gpu), but this "
                                         "process drives no GPU");
  const bool on_gpu = gpu_can && device != HqqSolverDevice::kCpu && count > 0;
  HqqSolved out;
  out.groups.resize(static_cast<size_t>(count));
  if (block_errors) out.block_errors.assign(static_cast<size_t>(blocks_of(count) * kHqqSolverIterations), 0.0);
#ifdef FSDPQ_WITH_CUDA
  if (on_gpu)
    solve_on_gpu(read, count, n_bits, updates, out);
  else
#endif
    solve_on_cpu(read, count, n_bits, updates, precision, out);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::lock_guard<std::mutex> lock(work_mutex);
  work_so_far.groups += count;
  work_so_far.seconds += seconds;
  if (on_gpu) work_so_far.gpu_groups += count;
  return out;
}

HqqSolved hqq_solve_groups(const float* values, int64_t count, int n_bits, int updates, HqqSolverPrecision precision,
                           bool block_errors, HqqSolverDevice device) {
  const auto read = [values](int64_t g, float* out) {
    std::memcpy(out, values + g * kHqqGroupSize, kHqqGroupSize * sizeof(float));
  };
  return hqq_solve_groups(read, count, n_bits, updates, precision, block_errors, device);
}

HqqSolverWork hqq_solver_work() {
  const std::lock_guard<std::mutex> lock(work_mutex);
  return work_so_far;
}

}  // namespace fsdpq
