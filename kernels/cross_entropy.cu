#include "kernels/cross_entropy.cuh"

#include <cstdint>
#include <stdexcept>

#include "kernels/vector8.cuh"

namespace fsdpq::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int32_t kIgnore = -100;

// Merges two (max, Σ exp(v - max)) pairs. Symmetric in its arguments (max, and a sum of two terms),
// so both lanes of a butterfly step get the same bits: the reduction is deterministic.
__device__ __forceinline__ void merge(float& m, float& s, float m2, float s2) {
  const float mx = fmaxf(m, m2);
  const float a = m == -INFINITY ? 0.0f : s * expf(m - mx);
  const float b = m2 == -INFINITY ? 0.0f : s2 * expf(m2 - mx);
  m = mx;
  s = a + b;
}

__device__ void block_max_sum(float& m, float& s, float* shared_m, float* shared_s) {
  for (int mask = 16; mask > 0; mask >>= 1)
    merge(m, s, __shfl_xor_sync(0xffffffffu, m, mask), __shfl_xor_sync(0xffffffffu, s, mask));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  if (lane == 0) {
    shared_m[warp] = m;
    shared_s[warp] = s;
  }
  __syncthreads();
  m = lane < warps ? shared_m[lane] : -INFINITY;
  s = lane < warps ? shared_s[lane] : 0.0f;
  for (int mask = 16; mask > 0; mask >>= 1)
    merge(m, s, __shfl_xor_sync(0xffffffffu, m, mask), __shfl_xor_sync(0xffffffffu, s, mask));
}

// Adds element v to a thread's online (max m, Σ exp(· - m)).
__device__ __forceinline__ void add_online(float& m, float& s, float v) {
  if (v > m) {
    s = (m == -INFINITY ? 0.0f : s * expf(m - v)) + 1.0f;
    m = v;
  } else if (v > -INFINITY) {
    s += expf(v - m);
  }
}

// One block per row. Pass 1 reads the row once with an online max / sum of exponentials per
// thread (and thread 0 reads the target's logit); after the block reduction's barrier pass 2
// re-reads each element and overwrites it with its gradient, by the same thread, so dlogits may
// alias logits. VEC (rows of whole, 16-byte aligned 8-element groups: every vocabulary of a
// multiple of 8): each thread takes 8 consecutive elements a 16-byte access (load8 / store8),
// and folds a group into its running pair once, by the group's max; scalar 2-byte accesses left
// the kernel at ~0.9 TB/s on an H100 (ncu, bench/RESULTS.md stop 40).
template <class In, class Out, bool VEC>
__global__ void cross_entropy_kernel(const In* logits, const int32_t* labels, int64_t T, int64_t V, Out* dlogits,
                                     float grad_scale, float* row_loss) {
  __shared__ float shared_m[32], shared_s[32];
  const int64_t row = blockIdx.x;
  const int32_t target = row % T + 1 < T ? labels[row + 1] : kIgnore;
  Out* grad = dlogits + row * V;
  if (target == kIgnore) {  // uniform over the block
    for (int64_t i = threadIdx.x; i < V; i += blockDim.x) grad[i] = from_float<Out>(0.0f);
    if (threadIdx.x == 0) row_loss[row] = 0.0f;
    return;
  }
  const In* in = logits + row * V;
  const float target_logit = threadIdx.x == 0 ? to_float(in[target]) : 0.0f;
  float m = -INFINITY, s = 0.0f;
  if constexpr (VEC) {
    for (int64_t i = 8 * static_cast<int64_t>(threadIdx.x); i < V; i += 8 * static_cast<int64_t>(blockDim.x)) {
      float v[8];
      load8(v, in + i);
      float group_max = v[0];
#pragma unroll
      for (int k = 1; k < 8; ++k) group_max = fmaxf(group_max, v[k]);
      if (group_max > m) {
        s = m == -INFINITY ? 0.0f : s * expf(m - group_max);
        m = group_max;
      }
      if (m > -INFINITY) {
#pragma unroll
        for (int k = 0; k < 8; ++k) s += expf(v[k] - m);
      }
    }
  } else {
    for (int64_t i = threadIdx.x; i < V; i += blockDim.x) add_online(m, s, to_float(in[i]));
  }
  block_max_sum(m, s, shared_m, shared_s);
  const float log_sum = logf(s);
  if (threadIdx.x == 0) row_loss[row] = __fsub_rn(__fadd_rn(m, log_sum), target_logit);
  auto gradient = [&](float logit, int64_t i) {
    const float p = expf(__fsub_rn(__fsub_rn(logit, m), log_sum));
    return __fmul_rn(grad_scale, i == target ? __fsub_rn(p, 1.0f) : p);
  };
  if constexpr (VEC) {
    for (int64_t i = 8 * static_cast<int64_t>(threadIdx.x); i < V; i += 8 * static_cast<int64_t>(blockDim.x)) {
      float v[8];
      load8(v, in + i);
#pragma unroll
      for (int k = 0; k < 8; ++k) v[k] = gradient(v[k], i + k);
      store8(grad + i, v);
    }
  } else {
    for (int64_t i = threadIdx.x; i < V; i += blockDim.x) grad[i] = from_float<Out>(gradient(to_float(in[i]), i));
  }
}

}  // namespace

void cross_entropy_forward_backward(const void* logits, KType logits_type, const int32_t* labels, int64_t rows,
                                    int64_t T, int64_t V, void* dlogits, KType dlogits_type, float grad_scale,
                                    float* row_loss, cudaStream_t stream) {
  if (rows <= 0) return;
  if (rows > 0x7fffffff) throw std::logic_error("cross_entropy: too many rows for one grid");
  with_ktype(logits_type, [&](auto in_tag) {
    with_ktype(dlogits_type, [&](auto out_tag) {
      using In = decltype(in_tag);
      using Out = decltype(out_tag);
      // Whole 16-byte groups in every row: 8 elements a multiple of 16 bytes for either type, and
      // 16-byte aligned rows (V a multiple of 8, aligned bases).
      const bool vec = V % 8 == 0 && reinterpret_cast<uintptr_t>(logits) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(dlogits) % 16 == 0;
      const auto kernel = vec ? cross_entropy_kernel<In, Out, true> : cross_entropy_kernel<In, Out, false>;
      kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(static_cast<const In*>(logits), labels, T, V,
                                                                   static_cast<Out*>(dlogits), grad_scale, row_loss);
    });
  });
  check_launch("cross_entropy_forward_backward");
}

}  // namespace fsdpq::cuda
