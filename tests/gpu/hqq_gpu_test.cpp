// HQQ on the GPU equals HQQ on the CPU bit for bit, with no tolerance:
//  - dequantization (kernels/hqq.cu, reached through the HQQ frozen format: FrozenStorage::dense on
//    a weight placed on the GPU, as the model runs it) against hqq_dequantize_groups, for every
//    width and both compute dtypes;
//  - the solver (kernels/hqq_solve.cu through quant/hqq_solve.h) against the CPU's half solver:
//    every group's scale and zero point and every block's error sums, on weights that reach each
//    branch of it, and whole weights encoded with the solver on the GPU against the CPU's bytes.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "gpu/op_parity.h"
#include "quant/frozen_storage.h"
#include "quant/hqq.h"
#include "quant/hqq_solve.h"
#include "unit/hqq_test_weights.h"
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

// Sets FSDPQ_HQQ_SOLVER for one scope (where FrozenStorage::encode's solver runs).
class SolverOn {
 public:
  explicit SolverOn(const char* device) { setenv("FSDPQ_HQQ_SOLVER", device, 1); }
  ~SolverOn() { unsetenv("FSDPQ_HQQ_SOLVER"); }
};

void expect_same_solve(const std::vector<float>& w, int64_t count, int bits, int updates) {
  SCOPED_TRACE(fmt::format("{} groups, {} bits, {} updates", count, bits, updates));
  const HqqSolved cpu = hqq_solve_groups(w.data(), count, bits, updates, HqqSolverPrecision::kHalf, true,
                                         HqqSolverDevice::kCpu);
  const HqqSolved gpu = hqq_solve_groups(w.data(), count, bits, updates, HqqSolverPrecision::kHalf, true,
                                         HqqSolverDevice::kGpu);
  ASSERT_EQ(gpu.groups.size(), cpu.groups.size());
  int64_t differing = 0;
  for (size_t g = 0; g < cpu.groups.size(); ++g)
    if (float_bits(gpu.groups[g].scale) != float_bits(cpu.groups[g].scale) ||
        float_bits(gpu.groups[g].zero) != float_bits(cpu.groups[g].zero)) {
      if (differing++ < 5)
        ADD_FAILURE() << "group " << g << ": GPU scale " << gpu.groups[g].scale << " zero " << gpu.groups[g].zero
                      << ", CPU scale " << cpu.groups[g].scale << " zero " << cpu.groups[g].zero;
    }
  EXPECT_EQ(differing, 0);
  ASSERT_EQ(gpu.block_errors.size(), cpu.block_errors.size());
  EXPECT_EQ(std::memcmp(gpu.block_errors.data(), cpu.block_errors.data(), cpu.block_errors.size() * sizeof(double)), 0);
}

TEST(GpuHqq, SolverEqualsTheCpuBitForBit) {
  use_gpu();
  const int64_t count = 5 * kHqqBlockGroups + 17;
  const std::vector<float> w = test::hqq_test_weights(count, 11);
  for (int bits : {1, 2, 3, 4, 8})
    for (int updates : {0, 1, 7, kHqqSolverIterations}) expect_same_solve(w, count, bits, updates);
}

TEST(GpuHqq, SolverAcrossItsChunks) {
  use_gpu();
  const int64_t count = (int64_t{1} << 18) + 100;  // the GPU solves 2^18 groups at a time
  expect_same_solve(test::hqq_test_weights(count, 5), count, 4, kHqqSolverIterations);
}

// Whole weights, as the loader encodes them: the solver on the GPU gives the CPU's bytes.
TEST(GpuHqq, EncodingWithTheGpuSolverGivesTheCpuBytes) {
  use_gpu();
  for (int bits : {4, 3, 2})
    for (auto [rows, cols] : {std::pair<int64_t, int64_t>{176, 64}, {512, 1024}}) {
      SCOPED_TRACE(fmt::format("{} bits, {}x{}", bits, rows, cols));
      const std::vector<uint16_t> w = random_bf16_weights(rows * cols, static_cast<uint32_t>(bits * 31 + rows));
      std::vector<std::vector<uint8_t>> bytes;
      for (const char* device : {"cpu", "gpu"}) {
        const SolverOn solver(device);
        const int64_t gpu_before = hqq_solver_work().gpu_groups;
        FrozenStorage weight = FrozenStorage::encode(hqq_format(bits, DType::BF16), Shape{rows, cols}, w.data(), DType::BF16);
        EXPECT_EQ(hqq_solver_work().gpu_groups > gpu_before, std::string(device) == "gpu");
        std::vector<uint8_t> all;  // codes, zero points, scales
        for (size_t i = 0; i < weight.segments().size(); ++i)
          all.insert(all.end(), weight.segment(i).begin(), weight.segment(i).end());
        bytes.push_back(std::move(all));
      }
      EXPECT_EQ(bytes[0], bytes[1]);
    }
}

// How much faster the GPU solves a Llama-2-7B MLP weight (4096 x 11008) than this machine's CPU
// cores: printed, never a pass/fail condition.
TEST(GpuHqq, SolverTimePrinted) {
  use_gpu();
  const int64_t count = 4096 * 11008 / kHqqGroupSize;
  const std::vector<float> w = test::hqq_test_weights(count, 9);
  for (HqqSolverDevice device : {HqqSolverDevice::kGpu, HqqSolverDevice::kCpu}) {
    const auto start = std::chrono::steady_clock::now();
    hqq_solve_groups(w.data(), count, 4, kHqqSolverIterations, HqqSolverPrecision::kHalf, true, device);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("hqq solver, 4096x11008, 4 bits, 20 iterations, on the %s: %.3f s (%.1f M values/s)\n",
                device == HqqSolverDevice::kGpu ? "GPU" : "CPU", s, static_cast<double>(count * kHqqGroupSize) / s / 1e6);
  }
}

}  // namespace
}  // namespace fsdpq
