// NF4 dequantization on the GPU (kernels/nf4.cu, reached through the NF4 frozen format:
// FrozenStorage::dense on a weight placed on the GPU, as the model runs it) equals the CPU
// nf4_dequantize bit for bit: the same fp32 products (code * absmax, absmax decoded in two
// roundings) and one rounding to the output type. No tolerance: any differing bit is a failure.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gpu/op_parity.h"
#include "quant/frozen_storage.h"
#include "quant/nf4.h"
#include "quant/nf4_device.h"
#include "util/bf16.h"

namespace fsdpq {
namespace {

using test::on_cpu;
using test::use_gpu;

// Normal-ish bf16 weights, with a zero block and a block of subnormals when there is room (both
// take special paths: NaN codes and flushed absmax).
std::vector<uint16_t> random_bf16_weights(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<uint16_t> w(static_cast<size_t>(n));
  for (auto& v : w) {
    float x = normal(rng);
    if (x == 0.0f) x = 1e-3f;
    v = float_to_bf16(x);
  }
  if (n >= 4 * kNf4BlockSize)
    for (int64_t i = 2 * kNf4BlockSize; i < 3 * kNf4BlockSize; ++i) w[static_cast<size_t>(i)] = 0;
  if (n >= 6 * kNf4BlockSize)
    for (int64_t i = 4 * kNf4BlockSize; i < 5 * kNf4BlockSize; ++i)
      w[static_cast<size_t>(i)] = float_to_bf16((i % 2 ? 1.0f : -1.0f) * 3e-39f * static_cast<float>(i % 7 + 1));
  return w;
}

template <class T>
int64_t count_mismatches(const std::vector<T>& got, const std::vector<T>& want, const std::string& what) {
  int64_t bad = 0;
  for (size_t i = 0; i < want.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0 && ++bad <= 5)
      ADD_FAILURE() << what << ": element " << i << " differs";
  return bad;
}

template <class T>
std::vector<T> read_back(const Tensor& t) {
  Tensor host = on_cpu(t.view());
  std::vector<T> out(static_cast<size_t>(t.numel()));
  if (!out.empty()) std::memcpy(out.data(), host.view().data, out.size() * sizeof(T));
  return out;
}

// The kernel's view of a weight's segments on the GPU.
Nf4DeviceSegments device_segments(const FrozenStorage& weight, bool double_quant) {
  Nf4DeviceSegments d;
  d.packed = weight.segment(0).data();
  if (double_quant) {
    d.absmax_q = weight.segment(1).data();
    d.absmax_scale = reinterpret_cast<const float*>(weight.segment(2).data());
  } else {
    d.absmax = reinterpret_cast<const float*>(weight.segment(1).data());
  }
  d.absmax_offset = weight.scalars.absmax_offset;
  d.numel = weight.numel();
  return d;
}

// Quantizes on the CPU, dequantizes on both devices into BF16, F32 and F16 and compares bits.
void check_case(int64_t numel, bool double_quant, uint32_t seed) {
  const std::string what = "numel " + std::to_string(numel) + (double_quant ? " double_quant" : " plain");
  const std::vector<uint16_t> w = random_bf16_weights(numel, seed);
  const Nf4Tensor q = nf4_quantize(w.data(), numel, {numel}, double_quant);
  std::vector<uint16_t> cpu_bf16(static_cast<size_t>(numel));
  std::vector<float> cpu_f32(static_cast<size_t>(numel));
  nf4_dequantize(q, cpu_bf16.data());
  nf4_dequantize(q, cpu_f32.data());
  std::vector<uint16_t> cpu_f16(static_cast<size_t>(numel));
  for (size_t i = 0; i < cpu_f32.size(); ++i) cpu_f16[i] = float_to_f16(cpu_f32[i]);

  FrozenStorage weight = FrozenStorage::encode(nf4_format(double_quant), Shape{numel}, w.data(), DType::BF16);
  weight.place_on(Device::CUDA);
  ASSERT_EQ(weight.device(), Device::CUDA);
  Tensor bf16, f32, f16;
  weight.dense(bf16, DType::BF16);
  weight.dense(f32, DType::F32);
  weight.dense(f16, DType::F16);
  EXPECT_EQ(count_mismatches(read_back<uint16_t>(bf16), cpu_bf16, what + " BF16"), 0);
  EXPECT_EQ(count_mismatches(read_back<float>(f32), cpu_f32, what + " F32"), 0);
  EXPECT_EQ(count_mismatches(read_back<uint16_t>(f16), cpu_f16, what + " F16"), 0);
  // Back on the host, the same bytes as before.
  weight.place_on(Device::CPU);
  Tensor host_bf16;
  weight.dense(host_bf16, DType::BF16);
  EXPECT_EQ(count_mismatches(read_back<uint16_t>(host_bf16), cpu_bf16, what + " BF16 on the host"), 0);
  weight.place_on(Device::CUDA);
  const Nf4DeviceSegments dev = device_segments(weight, double_quant);

  // An output that is not 16-byte aligned takes the scalar path; same bits.
  Tensor padded = Tensor::empty(Shape{numel + 1}, DType::BF16, Device::CUDA);
  TensorView shifted = padded.view();
  shifted.data = static_cast<uint16_t*>(shifted.data) + 1;
  shifted.shape = Shape{numel};
  nf4_dequantize(dev, shifted);
  std::vector<uint16_t> got = read_back<uint16_t>(padded);
  got.erase(got.begin());
  EXPECT_EQ(count_mismatches(got, cpu_bf16, what + " BF16 unaligned"), 0);
}

TEST(GpuNf4, SmallAndOddSizesBitExact) {
  use_gpu();
  uint32_t seed = 1;
  for (int64_t numel : {int64_t{1}, int64_t{2}, int64_t{15}, int64_t{17}, int64_t{63}, int64_t{64}, int64_t{65},
                        int64_t{1000}, int64_t{64 * 256 + 1}, int64_t{64 * 256 * 3 + 37}})
    for (bool dq : {true, false}) check_case(numel, dq, seed++);
}

TEST(GpuNf4, LlamaWeightBitExact) {
  use_gpu();
  check_case(int64_t{4096} * 4096, true, 77);
  check_case(int64_t{4096} * 4096 + 4096 * 3 + 5, false, 78);
}

TEST(GpuNf4, EmptyAndShapeErrors) {
  use_gpu();
  Tensor out = Tensor::empty(Shape{0}, DType::BF16, Device::CUDA);
  EXPECT_NO_THROW(nf4_dequantize(Nf4DeviceSegments{}, out));
  const std::vector<uint16_t> w = random_bf16_weights(100, 5);
  FrozenStorage weight = FrozenStorage::encode(nf4_format(true), Shape{10, 10}, w.data(), DType::BF16);
  weight.place_on(Device::CUDA);
  const Nf4DeviceSegments dev2 = device_segments(weight, true);
  Tensor wrong = Tensor::empty(Shape{99}, DType::BF16, Device::CUDA);
  EXPECT_THROW(nf4_dequantize(dev2, wrong), std::logic_error);
  Tensor host = Tensor::empty(Shape{10, 10}, DType::BF16);
  EXPECT_THROW(nf4_dequantize(dev2, host), std::logic_error);
}

TEST(GpuNf4, Perf) {
  use_gpu();
  if (!test::perf_mode()) GTEST_SKIP() << "set FSDPQ_GPU_PERF=1";
  const int64_t rows = 11008, cols = 4096, numel = rows * cols;
  const std::vector<uint16_t> w = random_bf16_weights(numel, 9);
  const Nf4Tensor q = nf4_quantize(w.data(), numel, {rows, cols}, true);
  FrozenStorage weight = FrozenStorage::encode(nf4_format(true), Shape{rows, cols}, w.data(), DType::BF16);
  weight.place_on(Device::CUDA);
  const Nf4DeviceSegments dev = device_segments(weight, true);
  Tensor out = Tensor::empty(Shape{rows, cols}, DType::BF16, Device::CUDA);
  // Bytes moved: bf16 out + packed codes + absmax codes + group scales.
  const double bytes = numel * 2.0 + numel / 2.0 + q.num_blocks() + q.absmax_scale.size() * 4.0;
  test::report_perf("nf4_dequantize 11008x4096 -> bf16 (double quant)", bytes, 0, [&] { nf4_dequantize(dev, out); });
  Tensor out32 = Tensor::empty(Shape{rows, cols}, DType::F32, Device::CUDA);
  test::report_perf("nf4_dequantize 11008x4096 -> f32 (double quant)", numel * 4.0 + numel / 2.0 + q.num_blocks(), 0,
                    [&] { nf4_dequantize(dev, out32); });
}

}  // namespace
}  // namespace fsdpq
