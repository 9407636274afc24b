// attention_forward / attention_backward on the GPU's SIMT kernels (kernels/attention.cu) against
// the CPU op, through the same public functions (the op dispatches by device; the fixture selects
// the SIMT kernels, which the tensor-core ones otherwise replace for 16-bit q/k/v at D 64/128).
//
// Tolerances (normalized L2 error, tests/gpu/op_parity.h):
//  - fp32 outputs (out, lse, and every gradient written as F32): both devices do fp32 math on the
//    same stored inputs and differ only in summation order (the GPU sums keys in tiles with an
//    online softmax, the CPU row by row): ~1e-6 for out / lse; 1e-5 allowed. The gradients go
//    through dS = P (dP - rowsum(dO O)), a difference of similar terms, so their relative error
//    is larger: 1e-4.
//  - bf16 / f16 outputs: one rounding of nearly equal fp32 values, so elements agree or differ by
//    one ulp (2^-8 / 2^-11 relative) where the two fp32 values straddle a rounding boundary;
//    the normalized error stays far below one ulp: 1e-2 (bf16), 2e-3 (f16).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "gpu/op_parity.h"
#include "ops/attention.h"

namespace fsdpq {
namespace {

using test::expect_close;
using test::on_cpu;
using test::on_gpu;
using test::random_tensor;
using test::use_gpu;

struct Case {
  int64_t B, T, H, KV, D;
  std::string name() const {
    return "B" + std::to_string(B) + " T" + std::to_string(T) + " H" + std::to_string(H) + " KV" +
           std::to_string(KV) + " D" + std::to_string(D);
  }
};

// Storage types of one run: inputs (q, k, v, dout and the forward's out) and gradients.
struct Types {
  DType in, grad;
  std::string name() const {
    return std::string(dtype_name(in)) + "/" + std::string(dtype_name(grad));
  }
};

double tolerance_for(DType output, double fp32_tolerance) {
  if (output == DType::BF16) return 1e-2;
  if (output == DType::F16) return 2e-3;
  return fp32_tolerance;
}

void check_case(const Case& c, const Types& types, uint32_t seed, bool backward = true) {
  const std::string what = c.name() + " " + types.name();
  const Shape qs{c.B, c.T, c.H, c.D}, ks{c.B, c.T, c.KV, c.D};
  // q and k in [-2, 2) give peaked softmax rows (scores of several units), v in [-1, 1).
  Tensor q = random_tensor(qs, types.in, seed, -2.0f, 2.0f);
  Tensor k = random_tensor(ks, types.in, seed + 1, -2.0f, 2.0f);
  Tensor v = random_tensor(ks, types.in, seed + 2);
  Tensor dout = random_tensor(qs, types.in, seed + 3);
  Tensor gq = on_gpu(q), gk = on_gpu(k), gv = on_gpu(v), gdout = on_gpu(dout);

  // Forward on both devices.
  Tensor out = Tensor::empty(qs, types.in), lse = Tensor::empty(Shape{c.B, c.H, c.T}, DType::F32);
  Tensor gout = Tensor::empty(qs, types.in, Device::CUDA);
  Tensor glse = Tensor::empty(Shape{c.B, c.H, c.T}, DType::F32, Device::CUDA);
  attention_forward(out, lse, q, k, v);
  attention_forward(gout, glse, gq, gk, gv);
  expect_close(gout, out, tolerance_for(types.in, 1e-5), what + " out");
  expect_close(glse, lse, 1e-5, what + " lse");
  if (!backward) return;

  // Backward: both from the CPU's out and lse, so only the backward itself is compared.
  Tensor gout_cpu = on_gpu(out), glse_cpu = on_gpu(lse);
  Tensor dq = Tensor::empty(qs, types.grad), dk = Tensor::empty(ks, types.grad), dv = Tensor::empty(ks, types.grad);
  Tensor gdq = Tensor::empty(qs, types.grad, Device::CUDA), gdk = Tensor::empty(ks, types.grad, Device::CUDA),
         gdv = Tensor::empty(ks, types.grad, Device::CUDA);
  attention_backward(dq, dk, dv, dout, q, k, v, out, lse);
  attention_backward(gdq, gdk, gdv, gdout, gq, gk, gv, gout_cpu, glse_cpu);
  if (c.T == 1) {
    // One key: P = 1 and dP = dO . v = rowsum(dO * O), so dq = dk = 0 exactly; both devices
    // give rounding noise (|dS| ~ 1e-7 of terms of order one), so compare absolutely.
    EXPECT_LE(test::max_abs_diff(test::values_of(gdq), test::values_of(dq)), 1e-5) << what << " dq";
    EXPECT_LE(test::max_abs_diff(test::values_of(gdk), test::values_of(dk)), 1e-5) << what << " dk";
  } else {
    expect_close(gdq, dq, tolerance_for(types.grad, 1e-4), what + " dq");
    expect_close(gdk, dk, tolerance_for(types.grad, 1e-4), what + " dk");
  }
  expect_close(gdv, dv, tolerance_for(types.grad, 1e-4), what + " dv");
}

// Every test here runs the SIMT kernels and restores the process's choice afterwards.
class GpuOpsAttention : public ::testing::Test {
 protected:
  void SetUp() override {
    saved_ = gpu_attention_kernels();
    set_gpu_attention_kernels(GpuAttentionKernels::Simt);
  }
  void TearDown() override { set_gpu_attention_kernels(saved_); }

 private:
  GpuAttentionKernels saved_ = GpuAttentionKernels::TensorCores;
};

const Types kF32{DType::F32, DType::F32};
const Types kBf16F32Grads{DType::BF16, DType::F32};  // what the model passes
const Types kBf16{DType::BF16, DType::BF16};
const Types kF16F32Grads{DType::F16, DType::F32};

TEST_F(GpuOpsAttention, TinyAndOddShapes) {
  use_gpu();
  uint32_t seed = 100;
  for (const Case& c : {Case{1, 1, 1, 1, 64}, Case{1, 1, 4, 2, 128}, Case{2, 37, 4, 2, 48}, Case{1, 129, 4, 1, 80},
                        Case{2, 65, 6, 3, 16}, Case{1, 70, 2, 1, 256}, Case{1, 33, 4, 4, 160}, Case{1, 20, 2, 2, 7}})
    for (const Types& t : {kF32, kBf16F32Grads, kBf16, kF16F32Grads}) check_case(c, t, seed += 10);
}

TEST_F(GpuOpsAttention, MhaD64) {
  use_gpu();
  check_case(Case{2, 200, 8, 8, 64}, kF32, 7);
  check_case(Case{2, 200, 8, 8, 64}, kBf16F32Grads, 8);
  check_case(Case{2, 200, 8, 8, 64}, kF16F32Grads, 9);
}

TEST_F(GpuOpsAttention, GqaLlamaShape) {
  use_gpu();
  check_case(Case{1, 512, 32, 8, 128}, kBf16F32Grads, 11);
  check_case(Case{1, 512, 32, 8, 128}, kF32, 12);
  check_case(Case{1, 512, 32, 8, 128}, kBf16, 13);
}

// Mixed storage per operand (q BF16, k F32, v F16): each operand is read in its own type.
TEST_F(GpuOpsAttention, MixedOperandTypes) {
  use_gpu();
  const Shape qs{1, 45, 4, 64}, ks{1, 45, 2, 64};
  Tensor q = random_tensor(qs, DType::BF16, 1, -2.0f, 2.0f), k = random_tensor(ks, DType::F32, 2, -2.0f, 2.0f);
  Tensor v = random_tensor(ks, DType::F16, 3);
  Tensor out = Tensor::empty(qs, DType::F32), lse = Tensor::empty(Shape{1, 4, 45}, DType::F32);
  Tensor gout = Tensor::empty(qs, DType::F32, Device::CUDA), glse = Tensor::empty(Shape{1, 4, 45}, DType::F32, Device::CUDA);
  attention_forward(out, lse, q, k, v);
  Tensor gq = on_gpu(q), gk = on_gpu(k), gv = on_gpu(v);
  attention_forward(gout, glse, gq, gk, gv);
  expect_close(gout, out, 1e-5, "mixed out");
  expect_close(glse, lse, 1e-5, "mixed lse");
}

// Fixed reduction orders: two GPU runs give the same bits.
TEST_F(GpuOpsAttention, BackwardIsDeterministic) {
  use_gpu();
  const Shape qs{1, 300, 8, 128}, ks{1, 300, 2, 128};
  Tensor q = on_gpu(random_tensor(qs, DType::BF16, 5, -2.0f, 2.0f)), k = on_gpu(random_tensor(ks, DType::BF16, 6, -2.0f, 2.0f));
  Tensor v = on_gpu(random_tensor(ks, DType::BF16, 7)), dout = on_gpu(random_tensor(qs, DType::BF16, 8));
  Tensor out = Tensor::empty(qs, DType::BF16, Device::CUDA), lse = Tensor::empty(Shape{1, 8, 300}, DType::F32, Device::CUDA);
  attention_forward(out, lse, q, k, v);
  std::vector<std::vector<double>> runs;
  for (int run = 0; run < 2; ++run) {
    Tensor dq = Tensor::empty(qs, DType::F32, Device::CUDA), dk = Tensor::empty(ks, DType::F32, Device::CUDA),
           dv = Tensor::empty(ks, DType::F32, Device::CUDA);
    attention_backward(dq, dk, dv, dout, q, k, v, out, lse);
    std::vector<double> all = test::values_of(dq);
    for (const Tensor* t : {&dk, &dv}) {
      const std::vector<double> x = test::values_of(*t);
      all.insert(all.end(), x.begin(), x.end());
    }
    runs.push_back(std::move(all));
  }
  EXPECT_TRUE(runs[0] == runs[1]);
}

TEST_F(GpuOpsAttention, RejectsMixedDevices) {
  use_gpu();
  const Shape qs{1, 4, 2, 8};
  Tensor q = random_tensor(qs, DType::F32, 1), k = random_tensor(qs, DType::F32, 2), v = random_tensor(qs, DType::F32, 3);
  Tensor gq = on_gpu(q);
  Tensor out = Tensor::empty(qs, DType::F32, Device::CUDA), lse = Tensor::empty(Shape{1, 2, 4}, DType::F32, Device::CUDA);
  EXPECT_THROW(attention_forward(out, lse, gq, k, v), std::logic_error);
}

TEST_F(GpuOpsAttention, Perf) {
  use_gpu();
  if (!test::perf_mode()) GTEST_SKIP() << "set FSDPQ_GPU_PERF=1";
  const int64_t B = 1, T = 2048, H = 32, KV = 32, D = 128;
  const Shape qs{B, T, H, D}, ks{B, T, KV, D};
  Tensor q = on_gpu(random_tensor(qs, DType::BF16, 1, -2.0f, 2.0f)), k = on_gpu(random_tensor(ks, DType::BF16, 2, -2.0f, 2.0f));
  Tensor v = on_gpu(random_tensor(ks, DType::BF16, 3)), dout = on_gpu(random_tensor(qs, DType::BF16, 4));
  Tensor out = Tensor::empty(qs, DType::BF16, Device::CUDA), lse = Tensor::empty(Shape{B, H, T}, DType::F32, Device::CUDA);
  Tensor dq = Tensor::empty(qs, DType::F32, Device::CUDA), dk = Tensor::empty(ks, DType::F32, Device::CUDA),
         dv = Tensor::empty(ks, DType::F32, Device::CUDA);
  // Causal FLOPs: two T x T x D matmuls forward (half the matrix), five backward.
  const double fwd_flops = 4.0 * B * H * T * T * D / 2;
  test::report_perf("attention_forward B1 T2048 H32 KV32 D128 bf16", 0, fwd_flops,
                    [&] { attention_forward(out, lse, q, k, v); });
  test::report_perf("attention_backward B1 T2048 H32 KV32 D128 bf16 (f32 grads)", 0, 2.5 * fwd_flops,
                    [&] { attention_backward(dq, dk, dv, dout, q, k, v, out, lse); });
}

}  // namespace
}  // namespace fsdpq
