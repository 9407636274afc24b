#include "kernels/cross_entropy.cuh"

#include <stdexcept>

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

// One block per row. Pass 1 reads the row once with an online max / sum of exponentials per
// thread (and thread 0 reads the target's logit); after the block reduction's barrier pass 2
// re-reads each element and overwrites it with its gradient, by the same thread, so dlogits may
// alias logits.
template <class In, class Out>
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
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) {
    const float v = to_float(in[i]);
    if (v > m) {
      s = (m == -INFINITY ? 0.0f : s * expf(m - v)) + 1.0f;
      m = v;
    } else if (v > -INFINITY) {
      s += expf(v - m);
    }
  }
  block_max_sum(m, s, shared_m, shared_s);
  const float log_sum = logf(s);
  if (threadIdx.x == 0) row_loss[row] = __fsub_rn(__fadd_rn(m, log_sum), target_logit);
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x) {
    const float p = expf(__fsub_rn(__fsub_rn(to_float(in[i]), m), log_sum));
    grad[i] = from_float<Out>(__fmul_rn(grad_scale, i == target ? __fsub_rn(p, 1.0f) : p));
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
      cross_entropy_kernel<In, Out><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
          static_cast<const In*>(logits), labels, T, V, static_cast<Out*>(dlogits), grad_scale, row_loss);
    });
  });
  check_launch("cross_entropy_forward_backward");
}

}  // namespace fsdpq::cuda
