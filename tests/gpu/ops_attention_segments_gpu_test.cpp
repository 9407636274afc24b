// Attention over packed rows on the GPU (segment_start, ops/attention.h): every route's kernels —
// SIMT (kernels/attention.cu), tensor-core mma (kernels/attention_mma.cu), the Hopper wgmma ones
// (kernels/attention_sm90a.cu, attention_backward_sm90a.cu), and cuDNN's route (which declines
// segments and falls through) — against the CPU op on random inputs and random example layouts; segments of
// whole rows against plain causal attention, bit for bit; and a token's independence of the other
// examples of its row.
//
// Tolerances (normalized L2 error, tests/gpu/op_parity.h), as ops_attention_gpu_test.cpp and
// ops_attention_mma_gpu_test.cpp state them for plain causal attention, since a packed row is plain
// causal attention per example:
//  - SIMT, fp32 out and lse: the same fp32 math in another summation order: 1e-5.
//  - SIMT, fp32 gradients: through dS = P (dP - rowsum(dO O)), a difference of similar terms: 1e-4.
//  - bf16 outputs: one rounding of nearly equal fp32 values: 1e-2.
//  - the 16-bit kernels (mma, wgmma): P and dS rounded to 16 bits before their products: out 1e-2,
//    lse 1e-5, gradients 2e-2 (ops_attention_mma_gpu_test.cpp derives them).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "gpu/op_parity.h"
#include "kernels/attention_sm90a.cuh"
#include "ops/attention.h"
#include "ops/cuda/attention_wgmma.h"
#include "ops/elementwise.h"

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

// One case on the current route against the CPU reference (whose gradients are fp32): random q,
// k, v, dout and segments drawn from `seed`; `out_tolerance` for the output, `grad_tolerance` for
// the gradients. With one-token examples dq and dk are zero up to rounding noise.
void expect_case_matches_the_cpu(const Case& c, DType in, DType grad, uint32_t seed, const std::string& what,
                                 double out_tolerance, double grad_tolerance) {
  const Shape qs{c.B, c.T, c.H, c.D}, ks{c.B, c.T, c.KV, c.D};
  Tensor q = random_tensor(qs, in, seed, -2.0f, 2.0f), k = random_tensor(ks, in, seed + 1, -2.0f, 2.0f);
  Tensor v = random_tensor(ks, in, seed + 2), dout = random_tensor(qs, in, seed + 3);
  const Tensor starts = random_segment_starts(c.B, c.T, c.max_len, seed + 4);
  Tensor out = Tensor::empty(qs, in), lse = Tensor::empty(Shape{c.B, c.H, c.T}, DType::F32);
  Tensor dq = Tensor::empty(qs, DType::F32), dk = Tensor::empty(ks, DType::F32), dv = Tensor::empty(ks, DType::F32);
  attention_forward(out, lse, q, k, v, starts);
  attention_backward(dq, dk, dv, dout, q, k, v, out, lse, starts);
  const GpuResults g = run_on_gpu(c, in, grad, q, k, v, dout, starts);
  expect_close(g.out, out, out_tolerance, what + " out");
  expect_close(g.lse, lse, 1e-5, what + " lse");
  if (c.max_len == 1) {
    EXPECT_LE(test::max_abs_diff(test::values_of(g.dq), test::values_of(dq)), 1e-5) << what << " dq";
    EXPECT_LE(test::max_abs_diff(test::values_of(g.dk), test::values_of(dk)), 1e-5) << what << " dk";
  } else {
    expect_close(g.dq, dq, grad_tolerance, what + " dq");
    expect_close(g.dk, dk, grad_tolerance, what + " dk");
  }
  expect_close(g.dv, dv, grad_tolerance, what + " dv");
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
      expect_case_matches_the_cpu(c, in, grad, seed, what, tolerance_for(in, 1e-5), 1e-4);
      seed += 10;
    }
}

// The 16-bit routes against the CPU: mma and (on Hopper) wgmma in both passes; auto and cudnn,
// whose cuDNN kernels decline segments (the pass falls through to the Hopper or mma kernels).
void expect_route_matches_the_cpu(GpuAttentionKernels route, const std::string& route_name) {
  set_gpu_attention_kernels(route);
  uint32_t seed = 900;
  for (const Case& c : {Case{2, 200, 4, 2, 64, 70}, Case{2, 513, 8, 2, 128, 150}, Case{1, 1024, 4, 1, 128, 90},
                        Case{2, 130, 2, 1, 64, 1}, Case{1, 300, 4, 4, 128, 300}, Case{3, 77, 4, 2, 128, 20}})
    for (const auto& [in, grad] : {std::pair{DType::BF16, DType::F32}, {DType::F16, DType::F16}, {DType::BF16, DType::BF16}}) {
      const std::string what = route_name + " " + c.name() + " " + std::string(dtype_name(in)) + " grads " +
                               std::string(dtype_name(grad));
      expect_case_matches_the_cpu(c, in, grad, seed, what, 1e-2, 2e-2);
      seed += 10;
    }
}

TEST_F(GpuOpsAttentionSegments, MmaKernelsMatchTheCpu) {
  use_gpu();
  const cuda_ops::WgmmaAttentionCounts before = cuda_ops::wgmma_attention_counts();
  expect_route_matches_the_cpu(GpuAttentionKernels::TensorCores, "mma");
  EXPECT_EQ(cuda_ops::wgmma_attention_counts().forward_ran, before.forward_ran) << "the mma route ran wgmma";
}

TEST_F(GpuOpsAttentionSegments, WgmmaKernelsMatchTheCpu) {
  use_gpu();
  if (const std::string& why = cuda::attention_sm90a_unavailable(); !why.empty())
    GTEST_SKIP() << "no Hopper kernels here: " << why;
  const cuda_ops::WgmmaAttentionCounts before = cuda_ops::wgmma_attention_counts();
  expect_route_matches_the_cpu(GpuAttentionKernels::Wgmma, "wgmma");
  const cuda_ops::WgmmaAttentionCounts after = cuda_ops::wgmma_attention_counts();
  EXPECT_GT(after.forward_ran, before.forward_ran) << "the packed forward did not run on the wgmma kernel";
  EXPECT_GT(after.backward_ran, before.backward_ran) << "the packed backward did not run on the wgmma kernels";
  EXPECT_EQ(after.backward_declined, before.backward_declined) << "the wgmma backward declined a packed pass";
}

TEST_F(GpuOpsAttentionSegments, AutoAndCudnnRoutesMatchTheCpu) {
  use_gpu();
  expect_route_matches_the_cpu(GpuAttentionKernels::Auto, "auto");
  expect_route_matches_the_cpu(GpuAttentionKernels::Cudnn, "cudnn");
}

// segment_start of one example per row (all zeros) is plain causal attention: each route's
// segmented kernels then give exactly the bits of its plain ones (the masks and the skipped tiles
// change nothing, and no -inf maximum ever occurs).
TEST_F(GpuOpsAttentionSegments, WholeRowSegmentsEqualPlainCausalBitForBit) {
  use_gpu();
  for (GpuAttentionKernels route : {GpuAttentionKernels::Simt, GpuAttentionKernels::TensorCores,
                                    GpuAttentionKernels::Wgmma})
    for (const Case& c : {Case{2, 300, 8, 2, 128, 0}, Case{1, 200, 4, 1, 64, 0}}) {
      set_gpu_attention_kernels(route);
      const std::string what = "route " + std::to_string(static_cast<int>(route)) + " " + c.name();
      const Shape qs{c.B, c.T, c.H, c.D}, ks{c.B, c.T, c.KV, c.D};
      Tensor q = random_tensor(qs, DType::BF16, 31, -2.0f, 2.0f), k = random_tensor(ks, DType::BF16, 32, -2.0f, 2.0f);
      Tensor v = random_tensor(ks, DType::BF16, 33), dout = random_tensor(qs, DType::BF16, 34);
      Tensor zeros = Tensor::zeros(Shape{c.B, c.T}, DType::I32);
      Tensor gq = on_gpu(q), gk = on_gpu(k), gv = on_gpu(v), gdout = on_gpu(dout), gzeros = on_gpu(zeros);
      std::vector<std::vector<double>> results[2];
      for (int segmented = 0; segmented < 2; ++segmented) {
        const TensorView starts = segmented ? gzeros.view() : TensorView{};
        Tensor out = Tensor::empty(qs, DType::BF16, Device::CUDA);
        Tensor lse = Tensor::empty(Shape{c.B, c.H, c.T}, DType::F32, Device::CUDA);
        Tensor dq = Tensor::empty(qs, DType::F32, Device::CUDA), dk = Tensor::empty(ks, DType::F32, Device::CUDA),
               dv = Tensor::empty(ks, DType::F32, Device::CUDA);
        attention_forward(out, lse, gq, gk, gv, starts);
        attention_backward(dq, dk, dv, gdout, gq, gk, gv, out, lse, starts);
        for (const Tensor* t : {&out, &lse, &dq, &dk, &dv}) results[segmented].push_back(test::values_of(*t));
      }
      for (size_t i = 0; i < 5; ++i) EXPECT_EQ(results[1][i], results[0][i]) << what << " result " << i;
    }
}

// A token's output does not depend on another example of its row, on the GPU either, on every route.
TEST_F(GpuOpsAttentionSegments, AnotherExampleDoesNotChangeATokensOutput) {
  use_gpu();
  const Case c{1, 160, 4, 2, 64, 0};
  const Shape qs{c.B, c.T, c.H, c.D}, ks{c.B, c.T, c.KV, c.D};
  Tensor starts = Tensor::empty(Shape{1, c.T}, DType::I32);
  for (int64_t t = 0; t < c.T; ++t) starts.data<int32_t>()[t] = t < 100 ? 0 : 100;  // examples [0, 100), [100, 160)
  for (const auto& [route, dtype] : {std::pair{GpuAttentionKernels::Simt, DType::F32},
                                     {GpuAttentionKernels::TensorCores, DType::BF16},
                                     {GpuAttentionKernels::Wgmma, DType::BF16}}) {
    set_gpu_attention_kernels(route);
    const std::string what = "route " + std::to_string(static_cast<int>(route));
    Tensor q = random_tensor(qs, dtype, 11, -2.0f, 2.0f), k = random_tensor(ks, DType::F32, 12, -2.0f, 2.0f);
    Tensor v = random_tensor(ks, DType::F32, 13), dout = random_tensor(qs, dtype, 14);
    const auto in_dtype = [&](const Tensor& t) {  // the F32 keys and values, in the route's dtype
      Tensor converted = Tensor::empty(t.shape(), dtype);
      copy_convert(converted, t);
      return converted;
    };
    const GpuResults first = run_on_gpu(c, dtype, DType::F32, q, in_dtype(k), in_dtype(v), dout, starts);
    for (int64_t i = 100 * c.KV * c.D; i < k.numel(); ++i) {  // the second example's keys and values
      k.data<float>()[i] += 0.75f;
      v.data<float>()[i] -= 0.5f;
    }
    const GpuResults second = run_on_gpu(c, dtype, DType::F32, q, in_dtype(k), in_dtype(v), dout, starts);
    const std::vector<double> a = test::values_of(first.out), b = test::values_of(second.out);
    const size_t first_example = static_cast<size_t>(100 * c.H * c.D);
    EXPECT_TRUE(std::equal(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(first_example), b.begin())) << what;
    EXPECT_FALSE(std::equal(a.begin() + static_cast<std::ptrdiff_t>(first_example), a.end(),
                            b.begin() + static_cast<std::ptrdiff_t>(first_example)))
        << what;
  }
}

// What packed rows cost (FSDPQ_GPU_PERF=1 prints, never a pass/fail condition): the reference
// job's shape — Llama-2-7B heads, rows of 512 slots holding ~80-token examples — plain causal
// against packed, per route. TFLOP/s count the work the examples need (Σ len² / 2 per row), so a
// packed pass at the plain pass's rate skips everything masked.
TEST_F(GpuOpsAttentionSegments, Perf) {
  use_gpu();
  if (!test::perf_mode()) GTEST_SKIP() << "FSDPQ_GPU_PERF=1 prints the timings";
  const int64_t B = 16, T = 512, H = 32, D = 128;
  const Shape qs{B, T, H, D};
  Tensor q = on_gpu(random_tensor(qs, DType::BF16, 1, -2.0f, 2.0f)), k = on_gpu(random_tensor(qs, DType::BF16, 2));
  Tensor v = on_gpu(random_tensor(qs, DType::BF16, 3)), dout = on_gpu(random_tensor(qs, DType::BF16, 4));
  const Tensor host_starts = random_segment_starts(B, T, 160, 5);  // ~80 tokens on average
  Tensor starts = on_gpu(host_starts);
  double packed_pairs = 0.0;  // (query, key) pairs the examples need
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) packed_pairs += static_cast<double>(t - host_starts.data<int32_t>()[b * T + t] + 1);
  const double plain_pairs = static_cast<double>(B) * T * (T + 1) / 2;
  Tensor out = Tensor::empty(qs, DType::BF16, Device::CUDA), lse = Tensor::empty(Shape{B, H, T}, DType::F32, Device::CUDA);
  Tensor dq = Tensor::empty(qs, DType::BF16, Device::CUDA), dk = Tensor::empty(qs, DType::BF16, Device::CUDA),
         dv = Tensor::empty(qs, DType::BF16, Device::CUDA);
  for (const auto& [route, name] : {std::pair{GpuAttentionKernels::TensorCores, "mma"},
                                    {GpuAttentionKernels::Wgmma, "wgmma"}, {GpuAttentionKernels::Auto, "auto"}}) {
    set_gpu_attention_kernels(route);
    for (const bool packed : {false, true}) {
      const TensorView segments = packed ? starts.view() : TensorView{};
      const double flops = 4.0 * H * D * (packed ? packed_pairs : plain_pairs);
      const std::string what = fmt::format("attention {} {} B{} T{} H{} D{}", name, packed ? "packed" : "plain", B, T, H, D);
      test::report_perf(what + " fwd", 0, flops, [&] { attention_forward(out, lse, q, k, v, segments); });
      test::report_perf(what + " bwd", 0, 2.5 * flops,
                        [&] { attention_backward(dq, dk, dv, dout, q, k, v, out, lse, segments); });
    }
  }
}

}  // namespace
}  // namespace fsdpq
