// The GPU optimizer step and gradient passes against their CPU counterparts (ShardOptimizer,
// grad_sq_sum, DynamicLossScaler::unscale), on random non-zero data of odd sizes, through both
// the float4 path (16-byte aligned pointers) and the one-at-a-time path (pointers one element
// off), plus the checkpoint interchange between ShardOptimizer and DeviceShardOptimizer.
//
// Tolerances:
//  - optimizer params and state: 1e-6 normalized L2 error. The kernels do the CPU's fp32 ops in
//    the CPU's order, each rounded once (__fmul_rn & co.: no FMA contraction), with the same
//    fp32 scalars computed by the same host code, so the results are expected to be bit for bit
//    equal (the mismatch count is printed). 1e-6 (~16 fp32 ulps) leaves room for a 1-ulp
//    difference per operation over 5 steps, should either compiler ever fuse an operation.
//  - sum of squares: 1e-12 relative. Squares are exact in fp64 and the chunk partials are added
//    in the CPU's order; only the order inside a 2^16 chunk differs (a tree of 256 strided
//    sums vs left to right), ~sqrt(2^16)·1.1e-16 ≈ 3e-14 typical for non-negative terms.
//  - unscale, scale, compute copies: bit for bit (one correctly rounded fp32 multiply by the
//    same fp32 factor; round to nearest even). A NaN input must stay NaN (payload may differ).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda_backend.h"
#include "gpu/op_parity.h"
#include "kernels/reduce.cuh"
#include "optim/clip.h"
#include "optim/device_grads.h"
#include "optim/device_optimizer.h"
#include "optim/loss_scaler.h"
#include "optim/optimizer.h"
#include "test_support.h"
#include "util/bf16.h"
#include "util/error.h"

namespace fsdpq {
namespace {

using test::use_gpu;

constexpr double kOptimTolerance = 1e-6;
constexpr double kSqSumTolerance = 1e-12;

std::vector<float> random_values(int64_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) {
    x = dist(rng);
    if (x == 0.0f) x = hi * 0.5f;  // never zero
  }
  return v;
}

// A device buffer of `pad + values.size()` floats holding `values` from element `pad` on (pad 1
// makes the pointer 4 bytes off 16-byte alignment, so the kernels take their scalar path).
Tensor device_floats(const std::vector<float>& values, int64_t pad) {
  Tensor t = Tensor::zeros({static_cast<int64_t>(values.size()) + pad}, DType::F32, Device::CUDA);
  copy_bytes(t.data<float>() + pad, Device::CUDA, values.data(), Device::CPU, values.size() * sizeof(float));
  return t;
}

std::vector<float> host_floats(const float* device, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  copy_bytes(v.data(), Device::CPU, device, Device::CUDA, v.size() * sizeof(float));
  return v;
}

// Normalized L2 error against the CPU, plus the count of elements whose bits differ.
void expect_close(const std::vector<float>& gpu, const std::vector<float>& cpu, double tolerance,
                  const std::string& what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  double diff = 0.0, norm = 0.0, worst = 0.0;
  int64_t mismatched = 0, nonfinite = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    if (!std::isfinite(gpu[i])) ++nonfinite;
    if (float_bits(gpu[i]) != float_bits(cpu[i])) ++mismatched;
    const double d = static_cast<double>(gpu[i]) - cpu[i];
    diff += d * d;
    norm += static_cast<double>(cpu[i]) * cpu[i];
    worst = std::max(worst, std::abs(d));
  }
  const double err = std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30);
  std::printf("  %s: %lld of %zu elements differ in bits, normalized error %.3g\n", what.c_str(),
              static_cast<long long>(mismatched), cpu.size(), err);
  EXPECT_EQ(nonfinite, 0) << what << ": the GPU result holds inf or NaN";
  EXPECT_LE(err, tolerance) << what << ": max abs diff " << worst << ", " << mismatched << " elements differ";
}

uint16_t compute_bits(DType dtype, float v) { return dtype == DType::BF16 ? float_to_bf16(v) : float_to_f16(v); }

// ---- Optimizer steps --------------------------------------------------------------------------

// Five steps with a changing lr and weight decay on (decoupled for adamw, L2 for the others),
// on the CPU and on the GPU, from the same params and gradients; then params and every state
// buffer compared. With `compute`, the GPU also writes the fused compute copy, which must hold
// exactly the rounding of the GPU's own updated masters.
void run_steps(const std::string& name, double lr, int64_t n, int64_t pad, std::optional<DType> compute) {
  const std::string what = name + " n=" + std::to_string(n) + (pad ? " unaligned" : "") +
                           (compute ? std::string(" +") + std::string(dtype_name(*compute)) : "");
  SCOPED_TRACE(what);
  OptimizerConfig config = optimizer_config(name, lr, 0.01);
  config.weight_decay = 0.01;  // optimizer_config leaves it 0 for adam/sgd/adadelta: test the L2 path too
  ShardOptimizer cpu(config, n);
  DeviceShardOptimizer gpu(config, n);

  std::vector<float> param = random_values(n, 11, -1.0f, 1.0f);
  Tensor param_d = device_floats(param, pad);
  float* p = param_d.data<float>() + pad;
  Tensor compute_d;
  void* c = nullptr;
  if (compute) {
    compute_d = Tensor::zeros({n + pad}, *compute, Device::CUDA);
    c = static_cast<uint8_t*>(compute_d.view().data) + pad * static_cast<int64_t>(dtype_size(*compute));
  }

  for (int k = 0; k < 5; ++k) {
    const std::vector<float> grad = random_values(n, 100 + static_cast<uint32_t>(k), -0.5f, 0.5f);
    Tensor grad_d = device_floats(grad, pad);
    const double step_lr = lr * (1.0 - 0.15 * k);  // as a schedule would
    cpu.step(param.data(), grad.data(), step_lr);
    if (compute)
      gpu.step(p, grad_d.data<float>() + pad, step_lr, c, *compute);
    else
      gpu.step(p, grad_d.data<float>() + pad, step_lr);
  }
  cuda_synchronize();
  EXPECT_EQ(gpu.step_count(), 5);
  EXPECT_EQ(gpu.state_json(), cpu.state_json());

  const std::vector<float> got = host_floats(p, n);
  expect_close(got, param, kOptimTolerance, what + " param");
  auto cpu_state = cpu.state_buffers();
  auto gpu_state = gpu.state_buffers();
  ASSERT_EQ(cpu_state.size(), gpu_state.size());
  for (size_t s = 0; s < cpu_state.size(); ++s) {
    EXPECT_EQ(gpu_state[s].name, cpu_state[s].name);
    EXPECT_EQ(gpu_state[s].numel, n);
    std::vector<float> state(static_cast<size_t>(n));
    gpu.copy_state_to_host(s, 0, state);
    expect_close(state, std::vector<float>(cpu_state[s].data.begin(), cpu_state[s].data.end()), kOptimTolerance,
                 what + " " + cpu_state[s].name);
    EXPECT_EQ(host_floats(gpu_state[s].device_ptr, n), state) << "state_buffers() and copy_state_to_host disagree";
  }

  if (compute) {
    int64_t bad = 0;
    if (*compute == DType::F32) {
      const std::vector<float> copy = host_floats(static_cast<const float*>(c), n);
      for (int64_t i = 0; i < n; ++i) bad += float_bits(copy[i]) != float_bits(got[i]);
    } else {
      std::vector<uint16_t> copy(static_cast<size_t>(n));
      copy_bytes(copy.data(), Device::CPU, c, Device::CUDA, copy.size() * sizeof(uint16_t));
      for (int64_t i = 0; i < n; ++i) bad += copy[i] != compute_bits(*compute, got[i]);
    }
    EXPECT_EQ(bad, 0) << "compute-copy elements that are not the rounding of the updated master";
  }
}

struct Kind {
  const char* name;
  double lr;
  DType compute;
};
const Kind kKinds[] = {{"adamw", 1e-3, DType::BF16}, {"adam", 1e-3, DType::F16},
                       {"sgd", 0.05, DType::F32}, {"adadelta", 1.0, DType::BF16}};

TEST(GpuOptim, EveryOptimizerStepsAsTheCpu) {
  use_gpu();
  for (const Kind& kind : kKinds) {
    run_steps(kind.name, kind.lr, 300001, 0, std::nullopt);  // float4 body + 1-element tail
    run_steps(kind.name, kind.lr, 262147, 1, std::nullopt);  // unaligned: every element one at a time
  }
}

TEST(GpuOptim, FusedComputeCopy) {
  use_gpu();
  for (const Kind& kind : kKinds) {
    run_steps(kind.name, kind.lr, 300003, 0, kind.compute);
    run_steps(kind.name, kind.lr, 100001, 1, kind.compute);
  }
  run_steps("adamw", 1e-3, 300001, 0, DType::F16);
  run_steps("adamw", 1e-3, 300001, 0, DType::F32);
}

TEST(GpuOptim, SmallAndEmptyShards) {
  use_gpu();
  for (const Kind& kind : kKinds)
    for (int64_t n : {1, 3, 5, 255, 257}) run_steps(kind.name, kind.lr, n, 0, std::nullopt);
  DeviceShardOptimizer empty(optimizer_config("adamw", 1e-3, 0.1), 0);
  empty.step(nullptr, nullptr, 1e-3);
  cuda_synchronize();
  EXPECT_EQ(empty.step_count(), 1);
}

// A checkpoint written from either optimizer resumes in the other: the same JSON, the state
// copied through host spans (in two ranges, as a sharded checkpoint would), and the steps after
// the switch still match.
TEST(GpuOptim, StateJsonRoundTripBetweenCpuAndGpu) {
  use_gpu();
  for (const Kind& kind : kKinds) {
    SCOPED_TRACE(kind.name);
    const int64_t n = 200003, half = 77777;
    OptimizerConfig config = optimizer_config(kind.name, kind.lr, 0.01);
    config.weight_decay = 0.01;
    std::vector<float> param = random_values(n, 5, -1.0f, 1.0f);
    auto grad_at = [&](int k) { return random_values(n, 500 + static_cast<uint32_t>(k), -0.5f, 0.5f); };

    ShardOptimizer cpu(config, n);
    for (int k = 0; k < 3; ++k) cpu.step(param.data(), grad_at(k).data(), kind.lr);

    // CPU → GPU.
    DeviceShardOptimizer gpu(config, n);
    gpu.load_state_json(cpu.state_json());
    EXPECT_EQ(gpu.step_count(), 3);
    auto cpu_state = cpu.state_buffers();
    for (size_t s = 0; s < cpu_state.size(); ++s) {
      std::span<const float> all(cpu_state[s].data);
      gpu.copy_state_from_host(s, 0, all.subspan(0, half));
      gpu.copy_state_from_host(s, half, all.subspan(half));
    }
    Tensor param_d = device_floats(param, 0);
    for (int k = 3; k < 5; ++k) {
      const std::vector<float> grad = grad_at(k);
      Tensor grad_d = device_floats(grad, 0);
      cpu.step(param.data(), grad.data(), kind.lr);
      gpu.step(param_d.data<float>(), grad_d.data<float>(), kind.lr);
    }
    EXPECT_EQ(gpu.state_json(), cpu.state_json());
    expect_close(host_floats(param_d.data<float>(), n), param, kOptimTolerance, std::string(kind.name) + " resumed on GPU");

    // GPU → CPU.
    ShardOptimizer back(config, n);
    back.load_state_json(gpu.state_json());
    EXPECT_EQ(back.step_count(), 5);
    auto back_state = back.state_buffers();
    for (size_t s = 0; s < back_state.size(); ++s) {
      gpu.copy_state_to_host(s, 0, back_state[s].data.subspan(0, half));
      gpu.copy_state_to_host(s, half, back_state[s].data.subspan(half));
    }
    std::vector<float> back_param = host_floats(param_d.data<float>(), n);
    const std::vector<float> grad = grad_at(5);
    Tensor grad_d = device_floats(grad, 0);
    back.step(back_param.data(), grad.data(), kind.lr);
    gpu.step(param_d.data<float>(), grad_d.data<float>(), kind.lr);
    expect_close(host_floats(param_d.data<float>(), n), back_param, kOptimTolerance,
                 std::string(kind.name) + " resumed on CPU");
    for (size_t s = 0; s < back_state.size(); ++s) {
      std::vector<float> state(static_cast<size_t>(n));
      gpu.copy_state_to_host(s, 0, state);
      expect_close(state, std::vector<float>(back_state[s].data.begin(), back_state[s].data.end()), kOptimTolerance,
                   std::string(kind.name) + " " + back_state[s].name + " after the switch");
    }
  }
}

TEST(GpuOptim, LoadStateJsonRejectsWhatTheCpuRejects) {
  use_gpu();
  const OptimizerConfig config = optimizer_config("adamw", 1e-3, 0.1);
  ShardOptimizer cpu(config, 1001);
  DeviceShardOptimizer gpu(config, 1001);
  const nlohmann::json bad[] = {{{"optimizer", "sgd"}, {"step", 3}, {"numel", 1001}},
                                {{"optimizer", "adamw"}, {"step", 3}, {"numel", 1000}},
                                {{"optimizer", "adamw"}, {"step", -1}, {"numel", 1001}}};
  for (const nlohmann::json& state : bad) {
    const std::string want = test::error_of([&] { cpu.load_state_json(state); });
    EXPECT_NE(want, "<no error>");
    EXPECT_EQ(test::error_of([&] { gpu.load_state_json(state); }), want);
  }
  std::vector<float> host(10);
  EXPECT_THROW(gpu.copy_state_to_host(0, 995, host), std::logic_error);
  EXPECT_THROW(gpu.copy_state_from_host(2, 0, host), std::logic_error);
  EXPECT_THROW(gpu.copy_state_to_host(1, -1, host), std::logic_error);
}

// ---- Gradient passes ------------------------------------------------------------------------

TEST(GpuOptim, SumOfSquaresMatchesGradSqSum) {
  use_gpu();
  for (int64_t pad : {0, 1}) {
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{65535}, int64_t{65536}, int64_t{65537},
                      int64_t{3 * 65536 + 5}, int64_t{1000003}, int64_t{16777259}}) {
      std::vector<float> g = random_values(n, static_cast<uint32_t>(n), -2.0f, 2.0f);
      for (int64_t i = 0; i < n; i += 9973) g[static_cast<size_t>(i)] *= 1000.0f;  // a few large values
      Tensor d = device_floats(g, pad);
      const double want = grad_sq_sum(g.data(), n);
      const double got = device_grad_sq_sum(d.data<float>() + pad, n);
      EXPECT_NEAR(got, want, kSqSumTolerance * want) << "n=" << n << " pad=" << pad;
      EXPECT_EQ(device_grad_sq_sum(d.data<float>() + pad, n), got) << "not deterministic, n=" << n;
    }
  }
  EXPECT_EQ(device_grad_sq_sum(nullptr, 0), 0.0);

  // Several buffers at once, as ShardedTrainingState::grad_norm sums its units.
  std::vector<std::vector<float>> host = {random_values(70001, 1, -1, 1), random_values(3, 2, -1, 1),
                                          random_values(0, 3, -1, 1), random_values(200000, 4, -1, 1)};
  std::vector<Tensor> dev;
  std::vector<GradBuffer> cpu_bufs, gpu_bufs;
  for (auto& h : host) {
    dev.push_back(device_floats(h, 0));
    cpu_bufs.push_back({h.data(), static_cast<int64_t>(h.size())});
    gpu_bufs.push_back({dev.back().data<float>(), static_cast<int64_t>(h.size())});
  }
  const double want = grad_sq_sum(cpu_bufs);
  EXPECT_NEAR(device_grad_sq_sum(gpu_bufs), want, kSqSumTolerance * want);
}

// unscale: found-inf exactly when an inf/NaN is present, and the CPU's bits (a NaN stays NaN).
void check_unscale(const DynamicLossScaler& scaler, std::vector<float> values, int64_t pad, bool expect_inf,
                   const std::string& what) {
  SCOPED_TRACE(what);
  const int64_t n = static_cast<int64_t>(values.size());
  Tensor d = device_floats(values, pad);
  const bool cpu_found = scaler.unscale(values.data(), n);
  const bool gpu_found = device_unscale(d.data<float>() + pad, n, scaler);
  EXPECT_EQ(cpu_found, expect_inf);
  EXPECT_EQ(gpu_found, expect_inf);
  const std::vector<float> got = host_floats(d.data<float>() + pad, n);
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const size_t k = static_cast<size_t>(i);
    const bool same = std::isnan(values[k]) ? std::isnan(got[k]) : float_bits(got[k]) == float_bits(values[k]);
    if (!same && ++bad <= 5)
      ADD_FAILURE() << "element " << i << ": GPU " << got[k] << " CPU " << values[k];
  }
  EXPECT_EQ(bad, 0);
}

TEST(GpuOptim, UnscaleMatchesTheCpuBitForBit) {
  use_gpu();
  const float inf = std::numeric_limits<float>::infinity();
  // 2^16 (an exact reciprocal) and 3 (1/3 is rounded: multiplying by it differs from dividing).
  for (float init : {65536.0f, 3.0f}) {
    LossScalerConfig sc;
    sc.init_scale = init;
    const DynamicLossScaler scaler(sc);
    for (int64_t pad : {0, 1}) {
      const std::string tag = "scale " + std::to_string(init) + (pad ? " unaligned" : "");
      std::vector<float> v = random_values(300007, 9, -3000.0f, 3000.0f);
      for (size_t i = 0; i < v.size(); i += 1013) v[i] *= 1e-40f;  // subnormal results: no flush to zero
      check_unscale(scaler, v, pad, false, tag + " clean");
      std::vector<float> with_inf = v;
      with_inf[123457] = inf;
      check_unscale(scaler, with_inf, pad, true, tag + " +inf inside");
      std::vector<float> with_ninf = v;
      with_ninf.front() = -inf;
      check_unscale(scaler, with_ninf, pad, true, tag + " -inf first");
      std::vector<float> with_nan = v;
      with_nan.back() = std::numeric_limits<float>::quiet_NaN();  // in the scalar tail
      check_unscale(scaler, with_nan, pad, true, tag + " NaN last");
    }
  }
  // One flag over several buffers; only the second holds an inf.
  DynamicLossScaler scaler;
  std::vector<float> a = random_values(1001, 1, -1, 1), b = random_values(5003, 2, -1, 1);
  b[4000] = inf;
  Tensor da = device_floats(a, 0), db = device_floats(b, 0);
  const GradBuffer clean[] = {{da.data<float>(), 1001}};
  EXPECT_FALSE(device_unscale(clean, scaler));
  const GradBuffer both[] = {{da.data<float>(), 1001}, {db.data<float>(), 5003}};
  EXPECT_TRUE(device_unscale(both, scaler));
  EXPECT_FALSE(device_unscale(nullptr, 0, scaler));
}

TEST(GpuOptim, ScaleAndFillZero) {
  use_gpu();
  for (int64_t pad : {0, 1}) {
    std::vector<float> v = random_values(123457, 3, -10.0f, 10.0f);
    Tensor d = device_floats(v, pad);
    const float f = static_cast<float>(0.3);  // run_step's float(clip coefficient)
    for (float& g : v) g *= f;
    device_scale(d.data<float>() + pad, 123457, f);
    EXPECT_EQ(host_floats(d.data<float>() + pad, 123457), v) << "pad " << pad;
    device_fill_zero(d.data<float>() + pad, 123457);
    EXPECT_EQ(host_floats(d.data<float>() + pad, 123457), std::vector<float>(123457, 0.0f)) << "pad " << pad;
  }
  device_scale(nullptr, 0, 2.0f);
  device_fill_zero(nullptr, 0);
}

TEST(GpuOptim, StoreComputeMatchesTheHostRounding) {
  use_gpu();
  std::vector<float> v = random_values(100003, 8, -70000.0f, 70000.0f);  // beyond f16's range too
  for (size_t i = 0; i < v.size(); i += 7) v[i] *= 1e-6f;                // and f16 subnormals
  for (int64_t pad : {0, 1}) {
    Tensor src = device_floats(v, pad);
    for (DType dtype : {DType::BF16, DType::F16, DType::F32}) {
      Tensor dst = Tensor::zeros({100003 + pad}, dtype, Device::CUDA);
      void* out = static_cast<uint8_t*>(dst.view().data) + pad * static_cast<int64_t>(dtype_size(dtype));
      device_store_compute(dtype, src.data<float>() + pad, 100003, out);
      int64_t bad = 0;
      if (dtype == DType::F32) {
        bad = host_floats(static_cast<const float*>(out), 100003) == v ? 0 : 1;
      } else {
        std::vector<uint16_t> got(v.size());
        copy_bytes(got.data(), Device::CPU, out, Device::CUDA, got.size() * sizeof(uint16_t));
        for (size_t i = 0; i < v.size(); ++i) bad += got[i] != compute_bits(dtype, v[i]);
      }
      EXPECT_EQ(bad, 0) << dtype_name(dtype) << " pad " << pad;
    }
  }
}

// ---- Perf (FSDPQ_GPU_PERF=1): a 7B-scale trainable shard ---------------------------------------

TEST(GpuOptim, Perf) {
  if (!test::perf_mode()) GTEST_SKIP() << "perf mode only (FSDPQ_GPU_PERF=1)";
  use_gpu();
  const int64_t n = 160'000'000;
  Tensor param = Tensor::empty({n}, DType::F32, Device::CUDA), grad = Tensor::empty({n}, DType::F32, Device::CUDA);
  Tensor compute = Tensor::empty({n}, DType::BF16, Device::CUDA);
  cuda::fill(param.data<float>(), n, 0.5f, cuda::stream());
  cuda::fill(grad.data<float>(), n, 0.01f, cuda::stream());
  DeviceShardOptimizer adamw(optimizer_config("adamw", 1e-5, 0.1), n);
  const double N = static_cast<double>(n);
  // param, grad, exp_avg, exp_avg_sq read; param, exp_avg, exp_avg_sq written.
  test::report_perf("adamw step 160M", N * (4 + 3) * 4, 0, [&] { adamw.step(param.data<float>(), grad.data<float>(), 1e-5); });
  test::report_perf("adamw step 160M + bf16 compute copy", N * ((4 + 3) * 4 + 2), 0, [&] {
    adamw.step(param.data<float>(), grad.data<float>(), 1e-5, compute.view().data, DType::BF16);
  });
  test::report_perf("store_compute bf16 160M", N * (4 + 2), 0,
                    [&] { device_store_compute(DType::BF16, param.data<float>(), n, compute.view().data); });
  test::report_perf("grad sum of squares 160M", N * 4, 2 * N, [&] { device_grad_sq_sum(grad.data<float>(), n); });
  DynamicLossScaler scaler;
  test::report_perf("unscale 160M", N * 8, 0, [&] { device_unscale(grad.data<float>(), n, scaler); });
  test::report_perf("scale 160M", N * 8, 0, [&] { device_scale(grad.data<float>(), n, 1.0f); });
}

}  // namespace
}  // namespace fsdpq
