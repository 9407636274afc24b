// The op parity suite's helpers (ggml's test-backend-ops idea): run an op on random CPU tensors
// and on copies of them on the GPU, through the same public function (ops dispatch by device),
// and compare the results by normalized error against a stated tolerance.
//
// Perf mode: with FSDPQ_GPU_PERF=1 each case also times its CUDA call (median of 20 after 3
// warm-ups) and prints it with the bytes or FLOPs it moves; never a pass/fail condition.
#pragma once
#include <cuda_runtime.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "backend/cuda_backend.h"
#include "unit/ops_test_support.h"

namespace fsdpq::test {

// Every GPU test starts with this (the GPU test binary only runs where a GPU exists).
inline void use_gpu() { cuda_init(0); }

// A device copy of a host tensor (same dtype and shape).
inline Tensor on_gpu(const TensorView& host) { return copy_to(host, Device::CUDA); }
inline Tensor on_cpu(const TensorView& view) { return copy_to(view, Device::CPU); }

// The values of a tensor on either device, as doubles.
inline std::vector<double> values_of(const TensorView& view) {
  if (view.device == Device::CPU) return to_doubles(view);
  Tensor host = on_cpu(view);
  return to_doubles(host.view());
}

// ||gpu - cpu|| / ||cpu|| over two tensors' values, with a message naming the case.
inline void expect_close(const TensorView& gpu, const TensorView& cpu, double tolerance, const std::string& what) {
  const std::vector<double> got = values_of(gpu), want = values_of(cpu);
  ASSERT_EQ(got.size(), want.size()) << what;
  double worst_bad = 0;
  for (double g : got)
    if (!std::isfinite(g)) worst_bad = 1;
  EXPECT_EQ(worst_bad, 0) << what << ": the GPU result holds inf or NaN";
  const double err = relative_error(got, want);
  EXPECT_LE(err, tolerance) << what << ": normalized error " << err << " (max abs diff " << max_abs_diff(got, want)
                            << ")";
}

inline bool perf_mode() {
  const char* v = std::getenv("FSDPQ_GPU_PERF");
  return v != nullptr && std::string(v) == "1";
}

// Median milliseconds of fn() on the compute stream.
inline double time_on_gpu(const std::function<void()>& fn) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  for (int i = 0; i < 3; ++i) fn();
  std::vector<double> ms;
  for (int i = 0; i < 20; ++i) {
    cudaEventRecord(start, cuda::stream());
    fn();
    cudaEventRecord(stop, cuda::stream());
    cudaEventSynchronize(stop);
    float t = 0;
    cudaEventElapsedTime(&t, start, stop);
    ms.push_back(t);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// Perf mode only: times fn and prints "PERF <case>: <ms> ms, <GB/s> GB/s, <TFLOP/s> TFLOP/s".
inline void report_perf(const std::string& what, double bytes, double flops, const std::function<void()>& fn) {
  if (!perf_mode()) return;
  const double ms = time_on_gpu(fn);
  std::string line = fmt::format("PERF {}: {:.4f} ms", what, ms);
  if (bytes > 0) line += fmt::format(", {:.1f} GB/s", bytes / ms / 1e6);
  if (flops > 0) line += fmt::format(", {:.1f} TFLOP/s", flops / ms / 1e9);
  std::printf("%s\n", line.c_str());
}

}  // namespace fsdpq::test
