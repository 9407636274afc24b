// The tensor-core attention kernels (kernels/attention_mma.cu), called directly on device
// buffers, against the CPU op on the same inputs; and the public op's choice of them.
//
// Tolerances (normalized L2 error, tests/gpu/op_parity.h) and why:
//  - out (bf16 storage) 1e-2: the scores QKᵀ are products of bf16 values, exact in fp32, summed
//    in fp32 by the tensor cores (only the order differs from the CPU: ~1e-7). P is rounded to
//    bf16 before P V (as FlashAttention does): each weight moves by at most 2^-9 relative, with
//    random signs, so the output moves by well under 2^-9 ≈ 2e-3 normalized; then out is stored
//    as bf16 on both sides (one rounding, 2^-9 relative at most, mostly equal bits). Sum ≲ 4e-3.
//  - lse 1e-5: computed from the fp32 scores and the fp32 (unrounded) probabilities, so only the
//    summation order and exp2 vs exp differ (~1e-6).
//  - dq, dk, dv 2e-2: the kernels round dS and P to bf16 before their products (each ≤ 2^-9
//    relative), and round an fp32 dout to bf16 when loading it (what autocast does: the result is
//    the exact gradient for that rounded dout, and the gradient is linear in dout, so this adds
//    about 2^-9 normalized); dS = P (dP - rowsum(dO O)) is a difference of similar terms but both
//    are fp32, so its rounding error stays at the bf16 level. Three 2^-9 sources ≲ 6e-3; bf16
//    gradient storage adds one more rounding: 2e-2 covers all of it.
//  - T == 1: dq = dk = 0 exactly in exact math (P = 1, dP = rowsum(dO O)); both sides give
//    rounding noise of ~1e-7, so they are compared absolutely (1e-5).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/cuda_backend.h"
#include "gpu/op_parity.h"
#include "kernels/attention.cuh"
#include "kernels/attention_mma.cuh"
#include "ops/attention.h"

namespace fsdpq {
namespace {

using test::expect_close;
using test::on_gpu;
using test::random_tensor;
using test::use_gpu;

cuda::KType kt(DType t) {
  switch (t) {
    case DType::F32: return cuda::KType::F32;
    case DType::BF16: return cuda::KType::BF16;
    case DType::F16: return cuda::KType::F16;
    default: break;
  }
  throw std::logic_error("no kernel type");
}

struct Case {
  int64_t B, T, H, KV, D;
  std::string name() const {
    return "B" + std::to_string(B) + " T" + std::to_string(T) + " H" + std::to_string(H) + " KV" +
           std::to_string(KV) + " D" + std::to_string(D);
  }
};

// Storage types: q, k, v and out; dout; dq, dk, dv.
struct Types {
  DType in, dout, grad;
  std::string name() const {
    return std::string(dtype_name(in)) + "/" + std::string(dtype_name(dout)) + "/" + std::string(dtype_name(grad));
  }
};

const Types kModel{DType::BF16, DType::F32, DType::F32};  // what src/model/llama_layer.cpp passes
const Types kBf16{DType::BF16, DType::BF16, DType::BF16};
const Types kF16{DType::F16, DType::F16, DType::F32};

void mma_forward(const TensorView& out, const TensorView& lse, const TensorView& q, const TensorView& k,
                 const TensorView& v, const Case& c) {
  cuda::attention_mma_forward(out.data, kt(out.dtype), lse.as<float>(), q.data, kt(q.dtype), k.data, kt(k.dtype),
                              v.data, kt(v.dtype), nullptr, c.B, c.T, c.H, c.KV, c.D, cuda::stream());
}

void mma_backward(const TensorView& dq, const TensorView& dk, const TensorView& dv, const TensorView& dout,
                  const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                  const TensorView& lse, const TensorView& workspace, const Case& c) {
  cuda::attention_mma_backward(dq.data, kt(dq.dtype), dk.data, kt(dk.dtype), dv.data, kt(dv.dtype), dout.data,
                               kt(dout.dtype), q.data, kt(q.dtype), k.data, kt(k.dtype), v.data, kt(v.dtype),
                               out.data, kt(out.dtype), lse.as<const float>(), nullptr, workspace.as<float>(), c.B, c.T,
                               c.H, c.KV, c.D, cuda::stream());
}

Tensor workspace_for(const Case& c) {
  return Tensor::empty(Shape{cuda::attention_mma_workspace_floats(c.B, c.H, c.T)}, DType::F32, Device::CUDA);
}

void check_case(const Case& c, const Types& types, uint32_t seed) {
  const std::string what = c.name() + " " + types.name();
  const Shape qs{c.B, c.T, c.H, c.D}, ks{c.B, c.T, c.KV, c.D}, ls{c.B, c.H, c.T};
  // q and k in [-2, 2) give peaked softmax rows (scores of several units), v in [-1, 1).
  Tensor q = random_tensor(qs, types.in, seed, -2.0f, 2.0f);
  Tensor k = random_tensor(ks, types.in, seed + 1, -2.0f, 2.0f);
  Tensor v = random_tensor(ks, types.in, seed + 2);
  Tensor dout = random_tensor(qs, types.dout, seed + 3);
  Tensor gq = on_gpu(q), gk = on_gpu(k), gv = on_gpu(v), gdout = on_gpu(dout);

  Tensor out = Tensor::empty(qs, types.in), lse = Tensor::empty(ls, DType::F32);
  Tensor gout = Tensor::empty(qs, types.in, Device::CUDA), glse = Tensor::empty(ls, DType::F32, Device::CUDA);
  attention_forward(out, lse, q, k, v);
  mma_forward(gout, glse, gq, gk, gv, c);
  expect_close(gout, out, 1e-2, what + " out");
  expect_close(glse, lse, 1e-5, what + " lse");

  // Backward from the CPU's out and lse, so only the backward itself is compared.
  Tensor gout_cpu = on_gpu(out), glse_cpu = on_gpu(lse);
  Tensor dq = Tensor::empty(qs, types.grad), dk = Tensor::empty(ks, types.grad), dv = Tensor::empty(ks, types.grad);
  Tensor gdq = Tensor::empty(qs, types.grad, Device::CUDA), gdk = Tensor::empty(ks, types.grad, Device::CUDA),
         gdv = Tensor::empty(ks, types.grad, Device::CUDA);
  Tensor ws = workspace_for(c);
  attention_backward(dq, dk, dv, dout, q, k, v, out, lse);
  mma_backward(gdq, gdk, gdv, gdout, gq, gk, gv, gout_cpu, glse_cpu, ws, c);
  if (c.T == 1) {
    EXPECT_LE(test::max_abs_diff(test::values_of(gdq), test::values_of(dq)), 1e-5) << what << " dq";
    EXPECT_LE(test::max_abs_diff(test::values_of(gdk), test::values_of(dk)), 1e-5) << what << " dk";
  } else {
    expect_close(gdq, dq, 2e-2, what + " dq");
    expect_close(gdk, dk, 2e-2, what + " dk");
  }
  expect_close(gdv, dv, 2e-2, what + " dv");
}

TEST(GpuOpsAttentionMma, Supported) {
  using cuda::KType;
  EXPECT_TRUE(cuda::attention_mma_supported(KType::BF16, KType::BF16, KType::BF16, KType::BF16, 128));
  EXPECT_TRUE(cuda::attention_mma_supported(KType::BF16, KType::BF16, KType::BF16, KType::F32, 64));
  EXPECT_TRUE(cuda::attention_mma_supported(KType::F16, KType::F16, KType::F16, KType::F16, 64));
  EXPECT_FALSE(cuda::attention_mma_supported(KType::F32, KType::F32, KType::F32, KType::F32, 128));
  EXPECT_FALSE(cuda::attention_mma_supported(KType::BF16, KType::F16, KType::BF16, KType::BF16, 128));
  EXPECT_FALSE(cuda::attention_mma_supported(KType::BF16, KType::BF16, KType::BF16, KType::BF16, 80));
  EXPECT_FALSE(cuda::attention_mma_supported(KType::BF16, KType::BF16, KType::BF16, KType::BF16, 256));
}

// The model's types over every shape of the brief: T not a multiple of the 64-row tiles (1, 37,
// 129), exact multiples (64, 512), MHA and GQA, both head dims, one and two sequences.
TEST(GpuOpsAttentionMma, ModelTypesAllShapes) {
  use_gpu();
  uint32_t seed = 1000;
  for (int64_t D : {64, 128})
    for (int64_t B : {1, 2})
      for (const auto& [H, KV] : {std::pair<int64_t, int64_t>{8, 8}, {32, 8}})
        for (int64_t T : {1, 37, 64, 129, 512}) check_case(Case{B, T, H, KV, D}, kModel, seed += 10);
}

TEST(GpuOpsAttentionMma, Bf16GradientsAndDout) {
  use_gpu();
  uint32_t seed = 2000;
  for (const Case& c : {Case{1, 37, 8, 8, 64}, Case{2, 129, 32, 8, 128}, Case{1, 512, 32, 8, 128}})
    check_case(c, kBf16, seed += 10);
}

TEST(GpuOpsAttentionMma, F16) {
  use_gpu();
  uint32_t seed = 3000;
  for (const Case& c : {Case{1, 1, 8, 8, 64}, Case{2, 37, 8, 8, 128}, Case{1, 129, 32, 8, 64}, Case{1, 512, 32, 8, 128}})
    check_case(c, kF16, seed += 10);
}

// Fixed reduction orders (no atomics): two backward runs give the same bits.
TEST(GpuOpsAttentionMma, BackwardIsDeterministic) {
  use_gpu();
  for (int64_t D : {64, 128}) {
    const Case c{2, 300, 32, 8, D};
    const Shape qs{c.B, c.T, c.H, c.D}, ks{c.B, c.T, c.KV, c.D};
    Tensor q = on_gpu(random_tensor(qs, DType::BF16, 5, -2.0f, 2.0f));
    Tensor k = on_gpu(random_tensor(ks, DType::BF16, 6, -2.0f, 2.0f));
    Tensor v = on_gpu(random_tensor(ks, DType::BF16, 7)), dout = on_gpu(random_tensor(qs, DType::F32, 8));
    Tensor out = Tensor::empty(qs, DType::BF16, Device::CUDA);
    Tensor lse = Tensor::empty(Shape{c.B, c.H, c.T}, DType::F32, Device::CUDA);
    mma_forward(out, lse, q, k, v, c);
    Tensor ws = workspace_for(c);
    std::vector<std::vector<double>> runs;
    for (int run = 0; run < 2; ++run) {
      Tensor dq = Tensor::empty(qs, DType::F32, Device::CUDA), dk = Tensor::empty(ks, DType::F32, Device::CUDA),
             dv = Tensor::empty(ks, DType::F32, Device::CUDA);
      mma_backward(dq, dk, dv, dout, q, k, v, out, lse, ws, c);
      std::vector<double> all = test::values_of(dq);
      for (const Tensor* t : {&dk, &dv}) {
        const std::vector<double> x = test::values_of(*t);
        all.insert(all.end(), x.begin(), x.end());
      }
      runs.push_back(std::move(all));
    }
    EXPECT_TRUE(runs[0] == runs[1]) << "D" << D;
  }
}

// The public op takes these kernels by default for the model's types (bit for bit what the
// direct call gives) and the SIMT kernels when those are chosen (a different summation, so
// different bits somewhere in the output).
// FSDPQ_ATTENTION=mma: the public op runs these kernels, and the SIMT ones when those are chosen.
// (The default, auto, asks cuDNN first: GpuOpsAttentionCudnn.DefaultIsCudnnForwardDeterministicBackward.)
TEST(GpuOpsAttentionMma, PublicOpUsesThemWhenChosen) {
  use_gpu();
  const Case c{2, 96, 8, 2, 128};
  const Shape qs{c.B, c.T, c.H, c.D}, ks{c.B, c.T, c.KV, c.D}, ls{c.B, c.H, c.T};
  Tensor q = on_gpu(random_tensor(qs, DType::BF16, 41, -2.0f, 2.0f));
  Tensor k = on_gpu(random_tensor(ks, DType::BF16, 42, -2.0f, 2.0f));
  Tensor v = on_gpu(random_tensor(ks, DType::BF16, 43));
  auto forward = [&](bool direct) {
    Tensor out = Tensor::empty(qs, DType::BF16, Device::CUDA), lse = Tensor::empty(ls, DType::F32, Device::CUDA);
    if (direct) mma_forward(out, lse, q, k, v, c);
    else attention_forward(out, lse, q, k, v);
    return test::values_of(out);
  };
  ASSERT_EQ(gpu_attention_kernels(), GpuAttentionKernels::Auto) << "FSDPQ_ATTENTION is set in the environment";
  set_gpu_attention_kernels(GpuAttentionKernels::TensorCores);
  const std::vector<double> direct = forward(true);
  EXPECT_TRUE(forward(false) == direct);
  set_gpu_attention_kernels(GpuAttentionKernels::Simt);
  const std::vector<double> simt = forward(false);
  set_gpu_attention_kernels(GpuAttentionKernels::Auto);
  EXPECT_FALSE(simt == direct);
}

TEST(GpuOpsAttentionMma, RejectsUnsupported) {
  use_gpu();
  const Case c{1, 8, 2, 2, 128};
  Tensor q = on_gpu(random_tensor(Shape{1, 8, 2, 128}, DType::F32, 1));
  Tensor out = Tensor::empty(Shape{1, 8, 2, 128}, DType::F32, Device::CUDA);
  Tensor lse = Tensor::empty(Shape{1, 2, 8}, DType::F32, Device::CUDA);
  EXPECT_THROW(mma_forward(out, lse, q, q, q, c), std::logic_error);
}

TEST(GpuOpsAttentionMma, Perf) {
  use_gpu();
  if (!test::perf_mode()) GTEST_SKIP() << "set FSDPQ_GPU_PERF=1";
  for (const Case& c : {Case{1, 2048, 32, 32, 128}, Case{4, 512, 32, 32, 128}}) {
    const Shape qs{c.B, c.T, c.H, c.D}, ks{c.B, c.T, c.KV, c.D};
    Tensor q = on_gpu(random_tensor(qs, DType::BF16, 1, -2.0f, 2.0f));
    Tensor k = on_gpu(random_tensor(ks, DType::BF16, 2, -2.0f, 2.0f));
    Tensor v = on_gpu(random_tensor(ks, DType::BF16, 3)), dout = on_gpu(random_tensor(qs, DType::F32, 4));
    Tensor out = Tensor::empty(qs, DType::BF16, Device::CUDA);
    Tensor lse = Tensor::empty(Shape{c.B, c.H, c.T}, DType::F32, Device::CUDA);
    Tensor dq = Tensor::empty(qs, DType::F32, Device::CUDA), dk = Tensor::empty(ks, DType::F32, Device::CUDA),
           dv = Tensor::empty(ks, DType::F32, Device::CUDA);
    Tensor ws = workspace_for(c);
    // Causal FLOPs: two T x T x D matmuls forward (half the matrix), five backward.
    const double fwd_flops = 4.0 * c.B * c.H * c.T * c.T * c.D / 2;
    const std::string shape = c.name() + " bf16, f32 dout/grads";
    test::report_perf("attention_mma_forward " + shape, 0, fwd_flops, [&] { mma_forward(out, lse, q, k, v, c); });
    test::report_perf("attention_mma_backward " + shape, 0, 2.5 * fwd_flops,
                      [&] { mma_backward(dq, dk, dv, dout, q, k, v, out, lse, ws, c); });
    // The SIMT kernels on the same buffers, for comparison.
    test::report_perf("attention_forward (SIMT) " + shape, 0, fwd_flops, [&] {
      cuda::attention_forward(out.view().data, cuda::KType::BF16, lse.data<float>(), q.view().data,
                              cuda::KType::BF16, k.view().data, cuda::KType::BF16, v.view().data, cuda::KType::BF16,
                              /*segment_start=*/nullptr, c.B, c.T, c.H, c.KV, c.D, cuda::stream());
    });
    test::report_perf("attention_backward (SIMT) " + shape, 0, 2.5 * fwd_flops, [&] {
      cuda::attention_backward(dq.view().data, cuda::KType::F32, dk.view().data, cuda::KType::F32, dv.view().data,
                               cuda::KType::F32, dout.view().data, cuda::KType::F32, q.view().data,
                               cuda::KType::BF16, k.view().data, cuda::KType::BF16, v.view().data,
                               cuda::KType::BF16, out.view().data, cuda::KType::BF16, lse.data<float>(),
                               /*segment_start=*/nullptr, ws.data<float>(), c.B, c.T, c.H, c.KV, c.D, cuda::stream());
    });
  }
}

}  // namespace
}  // namespace fsdpq
