// For GPU tests (ctest label `gpu`): skip loudly when this machine has no usable GPU.
#pragma once
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <string>

namespace fsdpq::test {

// "" when a GPU is usable, else why not.
inline std::string why_no_gpu() {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return cudaGetErrorString(err);
  }
  return count > 0 ? "" : "no CUDA device";
}

}  // namespace fsdpq::test

#define FSDPQ_CUDA_CHECK(call)                                                              \
  do {                                                                                       \
    cudaError_t err_ = (call);                                                               \
    ASSERT_EQ(err_, cudaSuccess) << #call << ": " << cudaGetErrorString(err_);               \
  } while (0)
