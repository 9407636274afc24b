#include "kernels/lora_dropout.cuh"

namespace fsdpq::cuda {
namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

__device__ __forceinline__ uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// One hash gives the keep decisions of 4 consecutive elements, 16 bits each (ops/lora.h).
__device__ __forceinline__ uint64_t keep_word(uint64_t mixed_key, int64_t quad) {
  return mix64(mixed_key + static_cast<uint64_t>(quad + 1) * kGolden);
}

__device__ __forceinline__ bool keeps(uint64_t word, int lane, uint32_t threshold) {
  return static_cast<uint32_t>((word >> (16 * lane)) & 0xFFFFu) >= threshold;
}

// Each thread takes a quad: elements 4q .. 4q + 3 (fewer at the end of the tensor).
template <class T>
__global__ void apply_kernel(DropoutOutputs outs, const T* in, int64_t n, uint32_t threshold, float keep_scale) {
  const int64_t quads = (n + 3) / 4;
  for (int64_t q = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; q < quads;
       q += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t base = q * 4;
    const int count = static_cast<int>(n - base < 4 ? n - base : 4);
    T kept[4];
    for (int e = 0; e < count; ++e) kept[e] = from_float<T>(to_float(in[base + e]) * keep_scale);
    for (int j = 0; j < outs.count; ++j) {
      const uint64_t word = keep_word(outs.mixed_key[j], q);
      T* out = static_cast<T*>(outs.out[j]) + base;
      for (int e = 0; e < count; ++e) out[e] = keeps(word, e, threshold) ? kept[e] : from_float<T>(0.0f);
    }
  }
}

template <class T>
__global__ void accumulate_kernel(T* dx, const float* g, int64_t n, uint64_t key, uint32_t threshold,
                                  float keep_scale) {
  const int64_t quads = (n + 3) / 4;
  for (int64_t q = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; q < quads;
       q += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t base = q * 4;
    const int count = static_cast<int>(n - base < 4 ? n - base : 4);
    const uint64_t word = keep_word(key, q);
    for (int e = 0; e < count; ++e)
      if (keeps(word, e, threshold)) dx[base + e] = from_float<T>(to_float(dx[base + e]) + keep_scale * g[base + e]);
  }
}

}  // namespace

void lora_dropout_apply(KType type, const DropoutOutputs& outs, const void* in, int64_t n, uint32_t threshold,
                        float keep_scale, cudaStream_t stream) {
  if (n == 0 || outs.count == 0) return;
  with_ktype(type, [&](auto tag) {
    using T = decltype(tag);
    apply_kernel<T><<<blocks_for((n + 3) / 4), 256, 0, stream>>>(outs, static_cast<const T*>(in), n, threshold,
                                                                keep_scale);
  });
  check_launch("lora_dropout_apply");
}

void lora_dropout_accumulate(KType type, void* dx, const float* g, int64_t n, uint64_t mixed_key,
                             uint32_t threshold, float keep_scale, cudaStream_t stream) {
  if (n == 0) return;
  with_ktype(type, [&](auto tag) {
    using T = decltype(tag);
    accumulate_kernel<T><<<blocks_for((n + 3) / 4), 256, 0, stream>>>(static_cast<T*>(dx), g, n, mixed_key, threshold,
                                                                     keep_scale);
  });
  check_launch("lora_dropout_accumulate");
}

}  // namespace fsdpq::cuda
