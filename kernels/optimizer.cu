#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/adam_scalars.h"
#include "kernels/convert.cuh"
#include "kernels/optimizer.cuh"

namespace fsdpq::cuda {
namespace {

// ---- Per-element updates (each line names the CPU line of optim/optimizer.cpp it mirrors) ----

// torch.lerp for fp32, the two forms of ATen/native/Lerp.h (the CPU's lerp()).
__device__ __forceinline__ float lerp(float self, float end, float weight) {
  return fabsf(weight) < 0.5f ? __fadd_rn(self, __fmul_rn(weight, __fsub_rn(end, self)))
                              : __fsub_rn(end, __fmul_rn(__fsub_rn(end, self), __fsub_rn(1.0f, weight)));
}

struct AdamOp : AdamScalars {
  static constexpr int kStates = 2;

  __device__ __forceinline__ float operator()(float p, float g, float& m, float& v) const {
    if (decoupled) p = __fmul_rn(p, decay_factor);  // p = p * decay_factor
    if (l2) g = __fadd_rn(g, __fmul_rn(l2_weight, p));  // g = g + l2 * p
    m = lerp(m, g, avg_weight);                         // m = lerp(exp_avg, g, avg_weight)
    v = __fadd_rn(__fmul_rn(v, beta2), __fmul_rn(__fmul_rn(sq_weight, g), g));  // v*beta2 + sq_weight*g*g
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), bias_correction2_sqrt), eps);
    return __fadd_rn(p, __fdiv_rn(__fmul_rn(neg_step_size, m), denom));  // p + neg_step_size * m / denom
  }
};

struct SgdOp {
  static constexpr int kStates = 0;
  bool decay;
  float l2_weight, neg_lr;

  __device__ __forceinline__ float operator()(float p, float g, float&, float&) const {
    if (decay) g = __fadd_rn(g, __fmul_rn(l2_weight, p));  // g = g + l2 * param
    return __fadd_rn(p, __fmul_rn(neg_lr, g));             // param + neg_lr * g
  }
};

struct AdadeltaOp {
  static constexpr int kStates = 2;
  bool decay;
  float l2_weight, rho, one_minus_rho, eps, neg_lr;

  __device__ __forceinline__ float operator()(float p, float g, float& sq, float& acc) const {
    if (decay) g = __fadd_rn(g, __fmul_rn(l2_weight, p));
    sq = __fadd_rn(__fmul_rn(sq, rho), __fmul_rn(__fmul_rn(one_minus_rho, g), g));  // sq*rho + omr*g*g
    const float std_dev = __fsqrt_rn(__fadd_rn(sq, eps));                           // sqrt(sq + eps)
    float delta = __fsqrt_rn(__fadd_rn(acc, eps));                                  // sqrt(acc_delta + eps)
    delta = __fdiv_rn(delta, std_dev);                                              // delta / std_dev
    delta = __fmul_rn(delta, g);                                                    // delta * g
    acc = __fadd_rn(__fmul_rn(acc, rho), __fmul_rn(__fmul_rn(one_minus_rho, delta), delta));
    return __fadd_rn(p, __fmul_rn(neg_lr, delta));  // param + neg_lr * delta
  }
};

// ---- The one kernel every optimizer runs through --------------------------------------------

struct NoCompute {};  // the compute-copy type when there is no compute copy

template <class CT>
__device__ __forceinline__ void store_one(CT* out, int64_t i, float v) {
  if constexpr (!std::is_same_v<CT, NoCompute>) out[i] = from_float<CT>(v);
}

__device__ __forceinline__ uint32_t bits16(float v, __nv_bfloat16*) { return __bfloat16_as_ushort(__float2bfloat16(v)); }
__device__ __forceinline__ uint32_t bits16(float v, __half*) { return __half_as_ushort(__float2half(v)); }

// Four consecutive compute values at 4-element group i4 (the pointer is aligned to 4 elements).
template <class CT>
__device__ __forceinline__ void store_four(CT* out, int64_t i4, float4 v) {
  if constexpr (std::is_same_v<CT, NoCompute>) {
    return;
  } else if constexpr (std::is_same_v<CT, float>) {
    reinterpret_cast<float4*>(out)[i4] = v;
  } else {
    CT* tag = nullptr;
    uint2 packed;  // little endian: the lower address holds the low half
    packed.x = bits16(v.x, tag) | (bits16(v.y, tag) << 16);
    packed.y = bits16(v.z, tag) | (bits16(v.w, tag) << 16);
    reinterpret_cast<uint2*>(out)[i4] = packed;
  }
}

// Grid-stride over the buffers. kVec: every pointer is 16-byte aligned (the compute copy to
// 4 elements), so the body moves float4s; the last n % 4 elements (and everything when !kVec)
// go one at a time. Each element is independent, so the split changes no result.
template <class Op, class CT, bool kVec>
__global__ void __launch_bounds__(256) step_kernel(Op op, float* __restrict__ param, const float* __restrict__ grad,
                                                   float* __restrict__ s0, float* __restrict__ s1,
                                                   CT* __restrict__ compute, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  int64_t tail_begin = 0;
  if constexpr (kVec) {
    const int64_t n4 = n / 4;
    tail_begin = n4 * 4;
    for (int64_t i = tid; i < n4; i += stride) {
      float4 p = reinterpret_cast<const float4*>(param)[i];
      const float4 g = reinterpret_cast<const float4*>(grad)[i];
      float4 a = make_float4(0.f, 0.f, 0.f, 0.f), b = a;
      if constexpr (Op::kStates > 0) {
        a = reinterpret_cast<const float4*>(s0)[i];
        b = reinterpret_cast<const float4*>(s1)[i];
      }
      p.x = op(p.x, g.x, a.x, b.x);
      p.y = op(p.y, g.y, a.y, b.y);
      p.z = op(p.z, g.z, a.z, b.z);
      p.w = op(p.w, g.w, a.w, b.w);
      reinterpret_cast<float4*>(param)[i] = p;
      if constexpr (Op::kStates > 0) {
        reinterpret_cast<float4*>(s0)[i] = a;
        reinterpret_cast<float4*>(s1)[i] = b;
      }
      store_four(compute, i, p);
    }
  }
  for (int64_t i = tail_begin + tid; i < n; i += stride) {
    float a = 0.f, b = 0.f;
    if constexpr (Op::kStates > 0) {
      a = s0[i];
      b = s1[i];
    }
    const float p = op(param[i], grad[i], a, b);
    param[i] = p;
    if constexpr (Op::kStates > 0) {
      s0[i] = a;
      s1[i] = b;
    }
    store_one(compute, i, p);
  }
}

bool aligned(const void* p, uintptr_t bytes) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % bytes == 0; }

template <class Op, class CT>
void launch_step(const Op& op, float* param, const float* grad, float* s0, float* s1, CT* compute, int64_t n,
                 cudaStream_t stream) {
  size_t compute_size = 4;
  if constexpr (!std::is_same_v<CT, NoCompute>) compute_size = sizeof(CT);
  const bool vec = aligned(param, 16) && aligned(grad, 16) && aligned(s0, 16) && aligned(s1, 16) &&
                   aligned(compute, 4 * compute_size);
  if (vec)
    step_kernel<Op, CT, true><<<blocks_for(n / 4), 256, 0, stream>>>(op, param, grad, s0, s1, compute, n);
  else
    step_kernel<Op, CT, false><<<blocks_for(n), 256, 0, stream>>>(op, param, grad, s0, s1, compute, n);
}

template <class Op>
void launch_with_compute(const Op& op, float* param, const float* grad, float* s0, float* s1, int64_t n,
                         void* compute, KType compute_type, cudaStream_t stream) {
  if (compute == nullptr) {
    launch_step<Op, NoCompute>(op, param, grad, s0, s1, nullptr, n, stream);
    return;
  }
  with_ktype(compute_type, [&](auto tag) {
    using T = decltype(tag);
    launch_step<Op, T>(op, param, grad, s0, s1, static_cast<T*>(compute), n, stream);
  });
}

// The scalars of the CPU's steps, computed the same way (in double on the host, then rounded to
// fp32), so both devices apply the same fp32 constants; Adam's come from the one function both
// devices share (adam_scalars.h).
AdamOp adam_op(const OptimizerConfig& c, bool decoupled_decay, double lr, int64_t step) {
  AdamOp op;
  static_cast<AdamScalars&>(op) = adam_scalars(c.beta1, c.beta2, c.eps, c.weight_decay, decoupled_decay, lr, step);
  return op;
}

SgdOp sgd_op(const OptimizerConfig& c, double lr) {
  SgdOp op;
  op.decay = c.weight_decay != 0.0;
  op.l2_weight = static_cast<float>(c.weight_decay);
  op.neg_lr = static_cast<float>(-lr);
  return op;
}

AdadeltaOp adadelta_op(const OptimizerConfig& c, double lr) {
  AdadeltaOp op;
  op.decay = c.weight_decay != 0.0;
  op.l2_weight = static_cast<float>(c.weight_decay);
  op.rho = static_cast<float>(c.rho);
  op.one_minus_rho = static_cast<float>(1.0 - c.rho);
  op.eps = static_cast<float>(c.eps);
  op.neg_lr = static_cast<float>(-lr);
  return op;
}

}  // namespace

void optimizer_step(const OptimizerConfig& config, double lr, int64_t step, float* param, const float* grad,
                    float* const* state, int64_t n, void* compute, KType compute_type, cudaStream_t stream) {
  if (step < 1) throw std::logic_error("cuda::optimizer_step: step counts from 1");
  if (n < 0) throw std::logic_error("cuda::optimizer_step: negative size");
  if (n == 0) return;
  switch (config.kind) {
    case OptimizerKind::adamw:
    case OptimizerKind::adam:
      launch_with_compute(adam_op(config, config.kind == OptimizerKind::adamw, lr, step), param, grad, state[0],
                          state[1], n, compute, compute_type, stream);
      break;
    case OptimizerKind::sgd:
      launch_with_compute(sgd_op(config, lr), param, grad, nullptr, nullptr, n, compute, compute_type, stream);
      break;
    case OptimizerKind::adadelta:
      launch_with_compute(adadelta_op(config, lr), param, grad, state[0], state[1], n, compute, compute_type,
                          stream);
      break;
    default: throw std::logic_error("cuda::optimizer_step: unknown OptimizerKind");
  }
  check_launch("optimizer_step");
}

void store_compute(const float* src, void* dst, KType dst_type, int64_t n, cudaStream_t stream) {
  if (n < 0) throw std::logic_error("cuda::store_compute: negative size");
  if (n == 0) return;
  switch (dst_type) {
    case KType::F32: {
      const cudaError_t err =
          cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * sizeof(float), cudaMemcpyDeviceToDevice, stream);
      if (err != cudaSuccess)
        throw std::runtime_error(std::string("CUDA store_compute copy: ") + cudaGetErrorString(err));
      return;
    }
    case KType::BF16: float_to_bf16(src, static_cast<uint16_t*>(dst), n, stream); break;
    case KType::F16: float_to_f16(src, static_cast<uint16_t*>(dst), n, stream); break;
    default: throw std::logic_error("cuda::store_compute: unknown KType");
  }
  check_launch("store_compute");
}

}  // namespace fsdpq::cuda
