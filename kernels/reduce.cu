#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/reduce.cuh"

namespace fsdpq::cuda {
namespace {

constexpr int kThreads = 256;

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw std::runtime_error(std::string("CUDA ") + what + ": " + cudaGetErrorString(err));
}

__device__ __forceinline__ double square(float v) {
  const double d = v;
  return __dmul_rn(d, d);  // exact: a 24-bit significand squared fits in 53 bits
}

// One block per 2^16-element chunk: each thread adds its strided elements in fp64, then a fixed
// shared-memory tree adds the 256 thread sums. kVec: x is 16-byte aligned (so is every chunk).
template <bool kVec>
__global__ void __launch_bounds__(kThreads) sq_partials_kernel(const float* __restrict__ x, int64_t n,
                                                                double* __restrict__ partials) {
  __shared__ double sums[kThreads];
  const int64_t base = static_cast<int64_t>(blockIdx.x) * kSqSumChunk;
  const int64_t len = n - base < kSqSumChunk ? n - base : kSqSumChunk;
  const float* chunk = x + base;
  double sum = 0.0;
  int64_t start = 0;
  if constexpr (kVec) {
    const int64_t len4 = len / 4;
    start = len4 * 4;
#pragma unroll 4
    for (int64_t j = threadIdx.x; j < len4; j += kThreads) {
      const float4 v = reinterpret_cast<const float4*>(chunk)[j];
      sum = __dadd_rn(sum, square(v.x));
      sum = __dadd_rn(sum, square(v.y));
      sum = __dadd_rn(sum, square(v.z));
      sum = __dadd_rn(sum, square(v.w));
    }
  }
  for (int64_t j = start + threadIdx.x; j < len; j += kThreads) sum = __dadd_rn(sum, square(chunk[j]));
  sums[threadIdx.x] = sum;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (static_cast<int>(threadIdx.x) < s) sums[threadIdx.x] = __dadd_rn(sums[threadIdx.x], sums[threadIdx.x + s]);
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[blockIdx.x] = sums[0];
}

__device__ __forceinline__ int nonfinite(float v) { return (__float_as_uint(v) & 0x7f800000u) == 0x7f800000u; }

template <bool kVec>
__global__ void __launch_bounds__(kThreads) unscale_kernel(float* __restrict__ x, int64_t n, float inv,
                                                            int32_t* __restrict__ found) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  int bad = 0;
  int64_t tail_begin = 0;
  if constexpr (kVec) {
    const int64_t n4 = n / 4;
    tail_begin = n4 * 4;
    for (int64_t i = tid; i < n4; i += stride) {
      float4 v = reinterpret_cast<const float4*>(x)[i];
      bad |= nonfinite(v.x) | nonfinite(v.y) | nonfinite(v.z) | nonfinite(v.w);
      v.x = __fmul_rn(v.x, inv);
      v.y = __fmul_rn(v.y, inv);
      v.z = __fmul_rn(v.z, inv);
      v.w = __fmul_rn(v.w, inv);
      reinterpret_cast<float4*>(x)[i] = v;
    }
  }
  for (int64_t i = tail_begin + tid; i < n; i += stride) {
    const float v = x[i];
    bad |= nonfinite(v);
    x[i] = __fmul_rn(v, inv);
  }
  // Every block that saw a bad value stores the same 1: the flag's final value is independent
  // of timing (and of how many blocks store it).
  if (__syncthreads_or(bad) && threadIdx.x == 0) *found = 1;
}

// x[i] = mul ? x[i] * f : f, float4 at a time when aligned.
template <bool kVec, bool kMul>
__global__ void __launch_bounds__(kThreads) map_kernel(float* __restrict__ x, int64_t n, float f) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  int64_t tail_begin = 0;
  if constexpr (kVec) {
    const int64_t n4 = n / 4;
    tail_begin = n4 * 4;
    for (int64_t i = tid; i < n4; i += stride) {
      float4 v = make_float4(f, f, f, f);
      if constexpr (kMul) {
        v = reinterpret_cast<const float4*>(x)[i];
        v.x = __fmul_rn(v.x, f);
        v.y = __fmul_rn(v.y, f);
        v.z = __fmul_rn(v.z, f);
        v.w = __fmul_rn(v.w, f);
      }
      reinterpret_cast<float4*>(x)[i] = v;
    }
  }
  for (int64_t i = tail_begin + tid; i < n; i += stride) x[i] = kMul ? __fmul_rn(x[i], f) : f;
}

template <bool kMul>
void launch_map(float* x, int64_t n, float f, cudaStream_t stream) {
  if (aligned16(x))
    map_kernel<true, kMul><<<blocks_for(n / 4, kThreads), kThreads, 0, stream>>>(x, n, f);
  else
    map_kernel<false, kMul><<<blocks_for(n, kThreads), kThreads, 0, stream>>>(x, n, f);
}

}  // namespace

void sum_of_squares_partials(const float* x, int64_t n, double* partials, cudaStream_t stream) {
  if (n < 0) throw std::logic_error("cuda::sum_of_squares_partials: negative size");
  if (n == 0) return;
  const int64_t chunks = sum_of_squares_chunks(n);
  if (chunks > 0x7fffffff) throw std::logic_error("cuda::sum_of_squares_partials: buffer too large");
  const unsigned grid = static_cast<unsigned>(chunks);
  if (aligned16(x))
    sq_partials_kernel<true><<<grid, kThreads, 0, stream>>>(x, n, partials);
  else
    sq_partials_kernel<false><<<grid, kThreads, 0, stream>>>(x, n, partials);
  check_launch("sum_of_squares_partials");
}

double sum_of_squares_f64(const float* x, int64_t n, double* scratch, cudaStream_t stream) {
  if (n < 0) throw std::logic_error("cuda::sum_of_squares_f64: negative size");
  if (n == 0) return 0.0;
  const int64_t chunks = sum_of_squares_chunks(n);
  sum_of_squares_partials(x, n, scratch, stream);
  // The partials in chunk order, added exactly as clip.cpp's final loop adds them.
  std::vector<double> partial(static_cast<size_t>(chunks));
  check(cudaMemcpyAsync(partial.data(), scratch, partial.size() * sizeof(double), cudaMemcpyDeviceToHost, stream),
        "sum_of_squares_f64 copy");
  check(cudaStreamSynchronize(stream), "sum_of_squares_f64 synchronize");
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}

void scale(float* x, int64_t n, float f, cudaStream_t stream) {
  if (n < 0) throw std::logic_error("cuda::scale: negative size");
  if (n == 0) return;
  launch_map<true>(x, n, f, stream);
  check_launch("scale");
}

void unscale_and_check(float* x, int64_t n, float inv_scale, int32_t* found, cudaStream_t stream) {
  if (n < 0) throw std::logic_error("cuda::unscale_and_check: negative size");
  if (n == 0) return;
  if (aligned16(x))
    unscale_kernel<true><<<blocks_for(n / 4, kThreads), kThreads, 0, stream>>>(x, n, inv_scale, found);
  else
    unscale_kernel<false><<<blocks_for(n, kThreads), kThreads, 0, stream>>>(x, n, inv_scale, found);
  check_launch("unscale_and_check");
}

void fill(float* x, int64_t n, float value, cudaStream_t stream) {
  if (n < 0) throw std::logic_error("cuda::fill: negative size");
  if (n == 0) return;
  launch_map<false>(x, n, value, stream);
  check_launch("fill");
}

}  // namespace fsdpq::cuda
