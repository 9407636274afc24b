// GPU parity of DoRA (ops/dora.h): each CUDA kernel (kernels/dora.cu) and the composed forward,
// backward and weight norm, the same public op on random CPU tensors and on their GPU copies.
//
// Tolerances (normalized L2 error, op_parity.h):
//  - dora_magnitude_scale: exact (one IEEE division each side).
//  - dora_scale_columns: exact for fp32 outputs (one multiply, one add, each rounded), one output
//    ulp for 16-bit outputs where the fp32 value sits next to a rounding boundary: bf16 1e-2, f16 2e-3.
//  - dora_row_norms, dora_magnitude_backward: 1e-5 (fp32 sums in a block tree vs the CPU's order;
//    the CPU's row norms sum in double).
//  - dora_weight_norm: 1e-5 in fp32 (cuBLAS's fp32 GEMM vs the CPU's blocked one, then the norm);
//    2e-3 with bf16 A and B (cuBLAS multiplies bf16 operands, the CPU the same values in fp32; the
//    products then differ by fp32 rounding order only — the norm is dominated by W).
//  - dora_forward / dora_backward in fp32: 1e-4 (GEMMs in another order, TF32 never: fsdpq's
//    cuBLAS path keeps fp32); in bf16: 3e-2, the bf16 LoRA ops' tolerance (ops_matmul_gpu_test).
#include <gtest/gtest.h>

#include <string>

#include "gpu/op_parity.h"
#include "ops/dora.h"
#include "ops/elementwise.h"

namespace fsdpq {
namespace {

using test::expect_close;
using test::on_gpu;
using test::random_tensor;
using test::use_gpu;

constexpr DType kFloatTypes[] = {DType::F32, DType::BF16, DType::F16};

double tol_for(DType dtype, double f32) { return dtype == DType::BF16 ? 1e-2 : dtype == DType::F16 ? 2e-3 : f32; }

TEST(GpuDora, RowNormsMatchTheCpu) {
  use_gpu();
  for (const auto [rows, in] : {std::pair<int64_t, int64_t>{7, 33}, {64, 4096}, {3, 11008}}) {
    const Tensor P = random_tensor(Shape{rows, in}, DType::F32, 1);
    Tensor cpu = Tensor::empty(Shape{rows}, DType::F32);
    dora_row_norms(cpu, P);
    Tensor gpu = Tensor::empty(Shape{rows}, DType::F32, Device::CUDA);
    dora_row_norms(gpu, on_gpu(P));
    expect_close(gpu, cpu, 1e-5, fmt::format("row norms {}x{}", rows, in));
  }
}

TEST(GpuDora, MagnitudeScaleMatchesTheCpu) {
  use_gpu();
  for (DType m_type : kFloatTypes) {
    const Tensor m = random_tensor(Shape{1000}, m_type, 2, 0.1f, 2.0f);
    const Tensor n = random_tensor(Shape{1000}, DType::F32, 3, 0.5f, 4.0f);
    Tensor cpu = Tensor::empty(Shape{1000}, DType::F32), gpu = Tensor::empty(Shape{1000}, DType::F32, Device::CUDA);
    dora_magnitude_scale(cpu, m, n);
    dora_magnitude_scale(gpu, on_gpu(m), on_gpu(n));
    expect_close(gpu, cpu, 0.0, fmt::format("g = m / n, m {}", dtype_name(m_type)));
  }
}

TEST(GpuDora, ScaleColumnsMatchesTheCpu) {
  use_gpu();
  for (DType in_type : kFloatTypes)
    for (DType out_type : kFloatTypes)
      for (const bool accumulate : {false, true}) {
        const Tensor in = random_tensor(Shape{37, 301}, in_type, 4);
        const Tensor g = random_tensor(Shape{301}, DType::F32, 5, 0.5f, 1.5f);
        Tensor cpu = random_tensor(Shape{37, 301}, out_type, 6);
        Tensor gpu = on_gpu(cpu);
        dora_scale_columns(cpu, in, g, -1.0f, accumulate);
        dora_scale_columns(gpu, on_gpu(in), on_gpu(g), -1.0f, accumulate);
        expect_close(gpu, cpu, tol_for(out_type, 0.0),
                     fmt::format("scale columns {} -> {} accumulate {}", dtype_name(in_type), dtype_name(out_type),
                                 accumulate));
      }
}

TEST(GpuDora, MagnitudeBackwardMatchesTheCpu) {
  use_gpu();
  for (DType type : kFloatTypes)
    for (const auto [rows, cols] : {std::pair<int64_t, int64_t>{5, 40}, {1000, 333}, {8192, 64}}) {
      const Tensor dy = random_tensor(Shape{rows, cols}, type, 7);
      const Tensor z = random_tensor(Shape{rows, cols}, type, 8);
      const Tensor n = random_tensor(Shape{cols}, DType::F32, 9, 0.5f, 4.0f);
      Tensor cpu = random_tensor(Shape{cols}, DType::F32, 10);
      Tensor gpu = on_gpu(cpu);
      dora_magnitude_backward(cpu, dy, z, n);
      dora_magnitude_backward(gpu, on_gpu(dy), on_gpu(z), on_gpu(n));
      expect_close(gpu, cpu, 1e-5, fmt::format("dm {} {}x{}", dtype_name(type), rows, cols));
    }
}

TEST(GpuDora, WeightNormMatchesTheCpu) {
  use_gpu();
  for (DType type : {DType::F32, DType::BF16}) {
    const int64_t out = 300, in = 256, rank = 8;
    const Tensor W = random_tensor(Shape{out, in}, type, 11);
    const Tensor A = random_tensor(Shape{rank, in}, type, 12, -0.1f, 0.1f);
    const Tensor B = random_tensor(Shape{out, rank}, type, 13, -0.1f, 0.1f);
    Tensor cpu = Tensor::empty(Shape{out}, DType::F32), gpu = Tensor::empty(Shape{out}, DType::F32, Device::CUDA);
    dora_weight_norm(cpu, W, A, B, 2.0f);
    dora_weight_norm(gpu, on_gpu(W), on_gpu(A), on_gpu(B), 2.0f);
    expect_close(gpu, cpu, type == DType::F32 ? 1e-5 : 2e-3, fmt::format("weight norm {}", dtype_name(type)));
    // FSDPQ_DORA_NORM=expanded: the norms from W·Aᵀ and B·A·Aᵀ (dora_norm_from_parts's kernel),
    // against the CPU's direct norms, with B as large as A so the cross terms count.
    const Tensor B_large = random_tensor(Shape{out, rank}, type, 14, -1.0f, 1.0f);
    dora_weight_norm(cpu, W, A, B_large, 2.0f);
    set_gpu_dora_norm(GpuDoraNorm::Expanded);
    dora_weight_norm(gpu, on_gpu(W), on_gpu(A), on_gpu(B_large), 2.0f);
    set_gpu_dora_norm(GpuDoraNorm::Direct);
    expect_close(gpu, cpu, type == DType::F32 ? 1e-5 : 2e-3, fmt::format("expanded weight norm {}", dtype_name(type)));
  }
}

// The composed op: forward output and saved z, then every gradient, with and without dropout.
TEST(GpuDora, ForwardAndBackwardMatchTheCpu) {
  use_gpu();
  const int64_t M = 96, in = 128, out = 160, rank = 8;
  for (DType type : {DType::F32, DType::BF16})
    for (const float dropout : {0.0f, 0.1f}) {
      const std::string what = fmt::format("{} dropout {}", dtype_name(type), dropout);
      const double tol = type == DType::F32 ? 1e-4 : 3e-2;
      const Tensor x = random_tensor(Shape{M, in}, type, 20), W = random_tensor(Shape{out, in}, type, 21);
      const Tensor A = random_tensor(Shape{rank, in}, type, 22, -0.2f, 0.2f);
      const Tensor B = random_tensor(Shape{out, rank}, type, 23, -0.2f, 0.2f);
      const Tensor m = random_tensor(Shape{out}, type, 24, 1.0f, 3.0f);
      const Tensor dy = random_tensor(Shape{M, out}, type, 25);
      LoraParams params;
      params.alpha = 16.0f;
      params.dropout = dropout;
      params.training = true;
      params.dropout_key = 77;

      struct Side {
        Tensor norm, xa, z, y, dx, dA, dB, dm;
      };
      auto run = [&](Device device) {
        auto put = [&](const Tensor& t) { return device == Device::CUDA ? on_gpu(t) : copy_to(t, Device::CPU); };
        const Tensor xd = put(x), Wd = put(W), Ad = put(A), Bd = put(B), md = put(m), dyd = put(dy);
        Side s{Tensor::empty(Shape{out}, DType::F32, device), Tensor::empty(Shape{M, rank}, type, device),
               Tensor::empty(Shape{M, out}, type, device),    Tensor::empty(Shape{M, out}, type, device),
               Tensor::empty(Shape{M, in}, type, device),     Tensor::zeros(Shape{rank, in}, DType::F32, device),
               Tensor::zeros(Shape{out, rank}, DType::F32, device), Tensor::zeros(Shape{out}, DType::F32, device)};
        const DoraSite site{Wd, Ad, Bd, md, params};
        dora_weight_norm(s.norm, Wd, Ad, Bd, lora_scaling(params, rank));
        const DoraSaved saved{s.xa, s.z, s.norm};
        dora_forward(s.y, saved, xd, site);
        dora_backward(s.dx, false, s.dA, s.dB, s.dm, dyd, xd, saved, site);
        return s;
      };
      const Side cpu = run(Device::CPU), gpu = run(Device::CUDA);
      expect_close(gpu.norm, cpu.norm, type == DType::F32 ? 1e-5 : 2e-3, what + ": norm");
      expect_close(gpu.y, cpu.y, tol, what + ": y");
      expect_close(gpu.z, cpu.z, tol, what + ": z");
      expect_close(gpu.dx, cpu.dx, tol, what + ": dx");
      expect_close(gpu.dA, cpu.dA, tol, what + ": dA");
      expect_close(gpu.dB, cpu.dB, tol, what + ": dB");
      expect_close(gpu.dm, cpu.dm, tol, what + ": dm");
    }
}

}  // namespace
}  // namespace fsdpq
