// Attention over packed rows on the GPU (segment_start, ops/attention.h): the SIMT kernels
// (kernels/attention.cu) against the CPU op on random inputs and random example layouts, and the
// faster routes' clean decline (they fall back to the SIMT kernels, so they give the same bits).
//
// Tolerances (normalized L2 error, tests/gpu/op_parity.h), as ops_attention_gpu_test.cpp states
// them for plain causal attention, since a packed row is plain causal attention per example:
//  - fp32 out and lse: the same fp32 math in another summation order: 1e-5.
//  - fp32 gradients: through dS = P (dP - rowsum(dO O)), a difference of similar terms: 1e-4.
//  - bf16 outputs: one rounding of nearly equal fp32 values: 1e-2.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "gpu/op_parity.h"
#include "ops/attention.h"

namespace fsdpq {
namespace {

using test::expect_close;
using test::on_gpu;
using test::random_tensor;
using test::use_gpu;

// segment_start [B, T] of random examples of 1..max_len tokens (the last cut to fit the row), and
// in row 0 a tail of one-token padding segments, as the collator lays them out.
Tensor random_segment_starts(int64_t B, int64_t T, int max_len, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> length(1, max_len);
  Tensor starts = Tensor::empty(Shape{B, T}, DType::I32);
  int32_t* s = starts.data<int32_t>();
  for (int64_t b = 0; b < B; ++b) {
    const int64_t padding = b == 0 ? T / 5 : 0;
    int64_t t = 0;
    while (t < T - padding) {
      const int64_t len = std::min<int64_t>(length(rng), T - padding - t);
      for (int64_t i = 0; i < len; ++i) s[b * T + t + i] = static_cast<int32_t>(t);
      t += len;
    }
    for (; t < T; ++t) s[b * T + t] = static_cast<int32_t>(t);
  }
  return starts;
}

struct Case {
  int64_t B, T, H, KV, D;
  int max_len;
  std::string name() const {
    return "B" + std::to_string(B) + " T" + std::to_string(T) + " H" + std::to_string(H) + " KV" + std::to_string(KV) +
           " D" + std::to_string(D) + " examples of <= " + std::to_string(max_len);
  }
};

double tolerance_for(DType output, double fp32_tolerance) { return output == DType::BF16 ? 1e-2 : fp32_tolerance; }

// The results of one GPU forward and backward, on the host.
struct GpuResults {
  Tensor out, lse, dq, dk, dv;
};

GpuResults run_on_gpu(const Case& c, DType in, DType grad, const Tensor& q, const Tensor& k, const Tensor& v,
                      const Tensor& dout, const Tensor& starts) {
  const Shape qs{c.B, c.T, c.H, c.D}, ks{c.B, c.T, c.KV, c.D};
  Tensor gq = on_gpu(q), gk = on_gpu(k), gv = on_gpu(v), gdout = on_gpu(dout), gstarts = on_gpu(starts);
  Tensor out = Tensor::empty(qs, in, Device::CUDA), lse = Tensor::empty(Shape{c.B, c.H, c.T}, DType::F32, Device::CUDA);
  Tensor dq = Tensor::empty(qs, grad, Device::CUDA), dk = Tensor::empty(ks, grad, Device::CUDA),
         dv = Tensor::empty(ks, grad, Device::CUDA);
  attention_forward(out, lse, gq, gk, gv, gstarts);
  attention_backward(dq, dk, dv, gdout, gq, gk, gv, out, lse, gstarts);
  return {test::on_cpu(out), test::on_cpu(lse), test::on_cpu(dq), test::on_cpu(dk), test::on_cpu(dv)};
}

class GpuOpsAttentionSegments : public ::testing::Test {
 protected:
  void SetUp() override { saved_ = gpu_attention_kernels(); }
  void TearDown() override { set_gpu_attention_kernels(saved_); }

 private:
  GpuAttentionKernels saved_ = GpuAttentionKernels::Auto;
};

TEST_F(GpuOpsAttentionSegments, SimtKernelsMatchTheCpu) {
  use_gpu();
  set_gpu_attention_kernels(GpuAttentionKernels::Simt);
  uint32_t seed = 500;
  // Examples within a tile, across tile borders (64 rows at D <= 128, 32 above) and over several
  // tiles; rows that are one example; odd T and D.
  for (const Case& c : {Case{2, 37, 4, 2, 48, 9}, Case{3, 200, 4, 2, 64, 70}, Case{2, 513, 8, 2, 128, 150},
                        Case{1, 300, 4, 4, 256, 100}, Case{2, 130, 2, 1, 80, 1}, Case{1, 129, 4, 1, 64, 129}})
    for (const auto& [in, grad] : {std::pair{DType::F32, DType::F32}, {DType::BF16, DType::F32}}) {
      const std::string what = c.name() + " " + std::string(dtype_name(in));
      const Shape qs{c.B, c.T, c.H, c.D}, ks{c.B, c.T, c.KV, c.D};
      Tensor q = random_tensor(qs, in, seed, -2.0f, 2.0f), k = random_tensor(ks, in, seed + 1, -2.0f, 2.0f);
      Tensor v = random_tensor(ks, in, seed + 2), dout = random_tensor(qs, in, seed + 3);
      const Tensor starts = random_segment_starts(c.B, c.T, c.max_len, seed + 4);
      seed += 10;
      Tensor out = Tensor::empty(qs, in), lse = Tensor::empty(Shape{c.B, c.H, c.T}, DType::F32);
      Tensor dq = Tensor::empty(qs, grad), dk = Tensor::empty(ks, grad), dv = Tensor::empty(ks, grad);
      attention_forward(out, lse, q, k, v, starts);
      attention_backward(dq, dk, dv, dout, q, k, v, out, lse, starts);
      const GpuResults g = run_on_gpu(c, in, grad, q, k, v, dout, starts);
      expect_close(g.out, out, tolerance_for(in, 1e-5), what + " out");
      expect_close(g.lse, lse, 1e-5, what + " lse");
      if (c.max_len == 1) {  // one key per query: dq = dk = 0 up to rounding noise
        EXPECT_LE(test::max_abs_diff(test::values_of(g.dq), test::values_of(dq)), 1e-5) << what << " dq";
        EXPECT_LE(test::max_abs_diff(test::values_of(g.dk), test::values_of(dk)), 1e-5) << what << " dk";
      } else {
        expect_close(g.dq, dq, 1e-4, what + " dq");
        expect_close(g.dk, dk, 1e-4, what + " dk");
      }
      expect_close(g.dv, dv, 1e-4, what + " dv");
    }
}

// cuDNN, wgmma and mma decline segment_start today (ops/cuda/attention.cpp): every route then runs
// the SIMT kernels, bit for bit.
TEST_F(GpuOpsAttentionSegments, FasterRoutesDeclineToTheSimtKernels) {
  use_gpu();
  const Case c{2, 256, 8, 2, 128, 90};
  const Shape qs{c.B, c.T, c.H, c.D}, ks{c.B, c.T, c.KV, c.D};
  Tensor q = random_tensor(qs, DType::BF16, 1, -2.0f, 2.0f), k = random_tensor(ks, DType::BF16, 2, -2.0f, 2.0f);
  Tensor v = random_tensor(ks, DType::BF16, 3), dout = random_tensor(qs, DType::BF16, 4);
  const Tensor starts = random_segment_starts(c.B, c.T, c.max_len, 5);
  set_gpu_attention_kernels(GpuAttentionKernels::Simt);
  const GpuResults simt = run_on_gpu(c, DType::BF16, DType::F32, q, k, v, dout, starts);
  for (GpuAttentionKernels route : {GpuAttentionKernels::Auto, GpuAttentionKernels::TensorCores,
                                    GpuAttentionKernels::Cudnn, GpuAttentionKernels::Wgmma}) {
    set_gpu_attention_kernels(route);
    const GpuResults got = run_on_gpu(c, DType::BF16, DType::F32, q, k, v, dout, starts);
    const int index = static_cast<int>(route);
    EXPECT_EQ(test::values_of(got.out), test::values_of(simt.out)) << "route " << index;
    EXPECT_EQ(test::values_of(got.lse), test::values_of(simt.lse)) << "route " << index;
    EXPECT_EQ(test::values_of(got.dq), test::values_of(simt.dq)) << "route " << index;
    EXPECT_EQ(test::values_of(got.dk), test::values_of(simt.dk)) << "route " << index;
    EXPECT_EQ(test::values_of(got.dv), test::values_of(simt.dv)) << "route " << index;
  }
}

// A token's output does not depend on another example of its row, on the GPU either.
TEST_F(GpuOpsAttentionSegments, AnotherExampleDoesNotChangeATokensOutput) {
  use_gpu();
  set_gpu_attention_kernels(GpuAttentionKernels::Simt);
  const Case c{1, 160, 4, 2, 64, 0};
  const Shape qs{c.B, c.T, c.H, c.D}, ks{c.B, c.T, c.KV, c.D};
  Tensor starts = Tensor::empty(Shape{1, c.T}, DType::I32);
  for (int64_t t = 0; t < c.T; ++t) starts.data<int32_t>()[t] = t < 100 ? 0 : 100;  // examples [0, 100), [100, 160)
  Tensor q = random_tensor(qs, DType::F32, 11, -2.0f, 2.0f), k = random_tensor(ks, DType::F32, 12, -2.0f, 2.0f);
  Tensor v = random_tensor(ks, DType::F32, 13), dout = random_tensor(qs, DType::F32, 14);
  const GpuResults first = run_on_gpu(c, DType::F32, DType::F32, q, k, v, dout, starts);
  for (int64_t i = 100 * c.KV * c.D; i < k.numel(); ++i) {  // the second example's keys and values
    k.data<float>()[i] += 0.75f;
    v.data<float>()[i] -= 0.5f;
  }
  const GpuResults second = run_on_gpu(c, DType::F32, DType::F32, q, k, v, dout, starts);
  const std::vector<double> a = test::values_of(first.out), b = test::values_of(second.out);
  const size_t first_example = static_cast<size_t>(100 * c.H * c.D);
  EXPECT_TRUE(std::equal(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(first_example), b.begin()));
  EXPECT_FALSE(std::equal(a.begin() + static_cast<std::ptrdiff_t>(first_example), a.end(),
                          b.begin() + static_cast<std::ptrdiff_t>(first_example)));
}

}  // namespace
}  // namespace fsdpq
