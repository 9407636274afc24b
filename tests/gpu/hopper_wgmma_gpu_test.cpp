// The Hopper primitives of kernels/hopper/ on one warpgroup tile (tests/gpu/hopper_wgmma_kernels.h),
// against the CPU's product of the same 16-bit values: both operands from shared memory (the layout
// of attention's Q Kᵀ) and A from registers with B MN-major (attention's P V), BF16 and F16.
// The products of 16-bit values are exact in fp32, so only the summation order differs from the
// CPU's double sums (~1e-7 normalized); a wrong descriptor, swizzle or fragment layout gives O(1).
// Skipped where the sm_90a kernels cannot run (not compute capability 9.0).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gpu/hopper_wgmma_kernels.h"
#include "gpu/op_parity.h"
#include "kernels/attention_sm90a.cuh"

namespace fsdpq {
namespace {

constexpr double kTolerance = 1e-5;

void skip_unless_hopper() {
  test::use_gpu();
  if (const std::string& why = cuda::attention_sm90a_unavailable(); !why.empty()) GTEST_SKIP() << why;
}

// c [64][128] (+ transposed_b: b is [128][K] and c = a bᵀ; else b is [K][128] and c = a b).
std::vector<double> cpu_product(const std::vector<double>& a, const std::vector<double>& b, int K, bool transposed_b) {
  std::vector<double> c(64 * 128, 0.0);
  for (int m = 0; m < 64; ++m)
    for (int n = 0; n < 128; ++n) {
      double sum = 0;
      for (int k = 0; k < K; ++k) sum += a[m * K + k] * (transposed_b ? b[n * K + k] : b[k * 128 + n]);
      c[m * 128 + n] = sum;
    }
  return c;
}

void check_tile(DType type, bool registers_a, uint32_t seed) {
  const int K = registers_a ? 64 : 128;
  const Tensor a = test::random_tensor(Shape{64, K}, type, seed);
  const Tensor b = registers_a ? test::random_tensor(Shape{K, 128}, type, seed + 1)
                               : test::random_tensor(Shape{128, K}, type, seed + 1);
  const Tensor a_gpu = test::on_gpu(a), b_gpu = test::on_gpu(b);
  Tensor c = Tensor::empty(Shape{64, 128}, DType::F32, Device::CUDA);
  const cuda::KType kt = type == DType::BF16 ? cuda::KType::BF16 : cuda::KType::F16;
  if (registers_a)
    test::wgmma_tile_rs(c.data<float>(), a_gpu.view().data, b_gpu.view().data, kt, cuda::stream());
  else
    test::wgmma_tile_ss(c.data<float>(), a_gpu.view().data, b_gpu.view().data, kt, cuda::stream());
  const std::vector<double> got = test::values_of(c);
  const std::vector<double> want = cpu_product(test::values_of(a), test::values_of(b), K, !registers_a);
  const double err = test::relative_error(got, want);
  EXPECT_LE(err, kTolerance) << (registers_a ? "register A, MN-major B" : "shared A and B, K-major")
                             << ": normalized error " << err << ", max abs diff " << test::max_abs_diff(got, want)
                             << "; c[0][0..3] = " << got[0] << " " << got[1] << " " << got[2] << " " << got[3]
                             << ", want " << want[0] << " " << want[1] << " " << want[2] << " " << want[3];
  std::printf("WGMMA tile %s %s: normalized error %.2e\n", registers_a ? "rs" : "ss", std::string(dtype_name(type)).c_str(),
              err);
}

// A 64 x 64 tile product through `gpu` (a launcher of hopper_wgmma_kernels.h) against the CPU's
// sum of a(m, k) · b(k, n) over k, as `a_at`, `b_at` index the row-major 64 x 64 inputs.
using Tile64 = void (*)(float*, const void*, const void*, cuda::KType, cudaStream_t);
void check_tile64(Tile64 gpu, DType type, uint32_t seed, int (*a_at)(int m, int k), int (*b_at)(int k, int n),
                  const char* what) {
  const Tensor a = test::random_tensor(Shape{64, 64}, type, seed), b = test::random_tensor(Shape{64, 64}, type, seed + 1);
  const Tensor a_gpu = test::on_gpu(a), b_gpu = test::on_gpu(b);
  Tensor c = Tensor::empty(Shape{64, 64}, DType::F32, Device::CUDA);
  gpu(c.data<float>(), a_gpu.view().data, b_gpu.view().data, type == DType::BF16 ? cuda::KType::BF16 : cuda::KType::F16,
      cuda::stream());
  const std::vector<double> got = test::values_of(c), av = test::values_of(a), bv = test::values_of(b);
  std::vector<double> want(64 * 64, 0.0);
  for (int m = 0; m < 64; ++m)
    for (int n = 0; n < 64; ++n)
      for (int k = 0; k < 64; ++k) want[m * 64 + n] += av[a_at(m, k)] * bv[b_at(k, n)];
  const double err = test::relative_error(got, want);
  EXPECT_LE(err, kTolerance) << what << ": normalized error " << err;
}

// The LoRA down kernel's operands: A loaded from a swizzled tile by ldmatrix, B K-major (c = a bᵀ).
TEST(GpuHopperWgmma, SwizzledRegisterAKMajorB) {
  skip_unless_hopper();
  auto a_at = [](int m, int k) { return m * 64 + k; };
  auto b_at = [](int k, int n) { return n * 64 + k; };
  for (DType type : {DType::BF16, DType::F16})
    check_tile64(test::wgmma_tile_rs_swizzled, type, 50, a_at, b_at, "ldmatrix A from a swizzled tile, K-major B");
}

// The LoRA weight gradient's operands: A and B both MN-major from shared memory (c = aᵀ b).
TEST(GpuHopperWgmma, BothOperandsMnMajor) {
  skip_unless_hopper();
  auto a_at = [](int m, int k) { return k * 64 + m; };
  auto b_at = [](int k, int n) { return k * 64 + n; };
  for (DType type : {DType::BF16, DType::F16})
    check_tile64(test::wgmma_tile_ss_mn_major, type, 70, a_at, b_at, "A and B MN-major from shared memory");
}

TEST(GpuHopperWgmma, SharedOperandsBf16) {
  skip_unless_hopper();
  check_tile(DType::BF16, false, 10);
}
TEST(GpuHopperWgmma, SharedOperandsF16) {
  skip_unless_hopper();
  check_tile(DType::F16, false, 20);
}
TEST(GpuHopperWgmma, RegisterABf16) {
  skip_unless_hopper();
  check_tile(DType::BF16, true, 30);
}
TEST(GpuHopperWgmma, RegisterAF16) {
  skip_unless_hopper();
  check_tile(DType::F16, true, 40);
}

}  // namespace
}  // namespace fsdpq
