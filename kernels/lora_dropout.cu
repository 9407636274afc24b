#include "kernels/lora_dropout.cuh"

namespace fsdpq::cuda {
namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

__device__ __forceinline__ uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

__device__ __forceinline__ bool keeps(uint64_t mixed_key, uint64_t index, uint32_t threshold) {
  return static_cast<uint32_t>(mix64(mixed_key + (index + 1) * kGolden) >> 40) >= threshold;
}

template <class T>
__global__ void apply_kernel(DropoutOutputs outs, const T* in, int64_t n, uint32_t threshold, float keep_scale) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const T kept = from_float<T>(to_float(in[i]) * keep_scale);
    for (int j = 0; j < outs.count; ++j)
      static_cast<T*>(outs.out[j])[i] = keeps(outs.mixed_key[j], static_cast<uint64_t>(i), threshold) ? kept
                                                                                                    : from_float<T>(0.0f);
  }
}

template <class T>
__global__ void accumulate_kernel(T* dx, const float* g, int64_t n, uint64_t key, uint32_t threshold,
                                  float keep_scale) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    if (keeps(key, static_cast<uint64_t>(i), threshold)) dx[i] = from_float<T>(to_float(dx[i]) + keep_scale * g[i]);
}

}  // namespace

void lora_dropout_apply(KType type, const DropoutOutputs& outs, const void* in, int64_t n, uint32_t threshold,
                        float keep_scale, cudaStream_t stream) {
  if (n == 0 || outs.count == 0) return;
  with_ktype(type, [&](auto tag) {
    using T = decltype(tag);
    apply_kernel<T><<<blocks_for(n), 256, 0, stream>>>(outs, static_cast<const T*>(in), n, threshold, keep_scale);
  });
  check_launch("lora_dropout_apply");
}

void lora_dropout_accumulate(KType type, void* dx, const float* g, int64_t n, uint64_t mixed_key,
                             uint32_t threshold, float keep_scale, cudaStream_t stream) {
  if (n == 0) return;
  with_ktype(type, [&](auto tag) {
    using T = decltype(tag);
    accumulate_kernel<T><<<blocks_for(n), 256, 0, stream>>>(static_cast<T*>(dx), g, n, mixed_key, threshold, keep_scale);
  });
  check_launch("lora_dropout_accumulate");
}

}  // namespace fsdpq::cuda
