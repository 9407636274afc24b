// HQQ dequantization on the GPU (kernels/hqq.cu, reached through the HQQ frozen format:
// FrozenStorage::dense on a weight placed on the GPU, as the model runs it) equals the CPU
// hqq_dequantize_groups bit for bit: (code - zero) * scale, each operation rounded to the compute
// dtype, for every width and both compute dtypes. No tolerance.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "gpu/op_parity.h"
#include "quant/frozen_storage.h"
#include "quant/hqq.h"
#include "util/bf16.h"

namespace fsdpq {
namespace {

using test::on_cpu;
using test::use_gpu;

std::vector<uint16_t> random_bf16_weights(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<uint16_t> w(static_cast<size_t>(n));
  for (auto& v : w) v = float_to_bf16(normal(rng));
  for (int64_t i = 0; i < kHqqGroupSize && i < n; ++i) w[static_cast<size_t>(i)] = 0;  // a constant group
  return w;
}

std::vector<uint8_t> bytes_of(const TensorView& t) {
  Tensor host = on_cpu(t);
  const auto* p = static_cast<const uint8_t*>(host.view().data);
  return {p, p + host.nbytes()};
}

void check_case(int bits, DType meta, int64_t rows, int64_t cols) {
  SCOPED_TRACE(fmt::format("{} bits, {}, {}x{}", bits, dtype_name(meta), rows, cols));
  const std::vector<uint16_t> w = random_bf16_weights(rows * cols, static_cast<uint32_t>(bits * 1000 + rows));
  FrozenStorage weight = FrozenStorage::encode(hqq_format(bits, meta), Shape{rows, cols}, w.data(), DType::BF16);
  Tensor cpu_meta, cpu_f32;
  const std::vector<uint8_t> want_meta = bytes_of(weight.dense(cpu_meta, meta));
  const std::vector<uint8_t> want_f32 = bytes_of(weight.dense(cpu_f32, DType::F32));
  weight.place_on(Device::CUDA);
  ASSERT_EQ(weight.device(), Device::CUDA);
  Tensor gpu_meta, gpu_f32;
  EXPECT_EQ(bytes_of(weight.dense(gpu_meta, meta)), want_meta);
  EXPECT_EQ(bytes_of(weight.dense(gpu_f32, DType::F32)), want_f32);
}

TEST(GpuHqq, EveryWidthBitExact) {
  use_gpu();
  for (int bits : {1, 2, 3, 4, 8})
    for (DType meta : {DType::BF16, DType::F16}) {
      check_case(bits, meta, 16, 256);
      check_case(bits, meta, 176, 64);  // the tiny preset's gate_proj: 3 bits pads 4 rows
    }
}

TEST(GpuHqq, LlamaWeightBitExact) {
  use_gpu();
  check_case(4, DType::BF16, 4096, 1024);
}

}  // namespace
}  // namespace fsdpq
