// The GPU's fp32 → bf16 / fp16 conversions give exactly the bits of the host's (util/bf16.h),
// so the CPU reference backend rounds as the CUDA backend does.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "gpu_test_support.h"
#include "kernels/convert.cuh"
#include "util/bf16.h"

namespace fsdpq {
namespace {

std::vector<float> hard_inputs() {
  std::mt19937 rng(1234);
  std::vector<float> v;
  // Random bit patterns cover ties, subnormals, infinities and NaNs; normals cover typical values.
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 1 << 20; ++i) v.push_back(bits_float(bits(rng)));
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (int i = 0; i < 1 << 18; ++i) v.push_back(normal(rng));
  for (uint32_t u = 0x3f800000u; u < 0x3f800000u + (1u << 17); ++u) v.push_back(bits_float(u));  // every tie near 1
  return v;
}

TEST(GpuConvert, Bf16AndF16BitsMatchTheHost) {
  std::vector<float> in = hard_inputs();
  const int64_t n = static_cast<int64_t>(in.size());
  float* d_in = nullptr;
  uint16_t* d_out = nullptr;
  FSDPQ_CUDA_CHECK(cudaMalloc(&d_in, n * sizeof(float)));
  FSDPQ_CUDA_CHECK(cudaMalloc(&d_out, n * sizeof(uint16_t)));
  FSDPQ_CUDA_CHECK(cudaMemcpy(d_in, in.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  std::vector<uint16_t> out(n);

  cuda::float_to_bf16(d_in, d_out, n, nullptr);
  FSDPQ_CUDA_CHECK(cudaMemcpy(out.data(), d_out, n * sizeof(uint16_t), cudaMemcpyDeviceToHost));
  int64_t bf16_mismatches = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint16_t host = float_to_bf16(in[i]);
    bool both_nan = std::isnan(in[i]) && (out[i] & 0x7f80) == 0x7f80 && (out[i] & 0x7f) && (host & 0x7f);
    if (out[i] != host && !both_nan && ++bf16_mismatches <= 5)
      ADD_FAILURE() << "bf16 of bits 0x" << std::hex << float_bits(in[i]) << ": GPU 0x" << out[i] << " host 0x" << host;
  }
  EXPECT_EQ(bf16_mismatches, 0);

  cuda::float_to_f16(d_in, d_out, n, nullptr);
  FSDPQ_CUDA_CHECK(cudaMemcpy(out.data(), d_out, n * sizeof(uint16_t), cudaMemcpyDeviceToHost));
  int64_t f16_mismatches = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint16_t host = float_to_f16(in[i]);
    bool both_nan = std::isnan(in[i]) && (out[i] & 0x7c00) == 0x7c00 && (out[i] & 0x3ff) && (host & 0x3ff);
    if (out[i] != host && !both_nan && ++f16_mismatches <= 5)
      ADD_FAILURE() << "f16 of bits 0x" << std::hex << float_bits(in[i]) << ": GPU 0x" << out[i] << " host 0x" << host;
  }
  EXPECT_EQ(f16_mismatches, 0);
  cudaFree(d_in);
  cudaFree(d_out);
}

}  // namespace
}  // namespace fsdpq
