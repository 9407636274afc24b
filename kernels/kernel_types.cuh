// Conventions every kernel family in kernels/ follows, so the C++ ops (src/ops/*.cpp) can call
// them without knowing CUDA types and every family reads the same way:
//  - A launcher is a host function in namespace fsdpq::cuda taking raw device pointers, the
//    storage type of each floating operand as a KType, int64 sizes, and the stream last.
//  - Storage is F32, BF16 or F16; math is fp32; each output is rounded once on store
//    (round to nearest even, the bits of util/bf16.h on the host).
//  - After launching, a launcher calls check_launch("name"), which throws std::runtime_error
//    naming the kernel and the CUDA error, so a bad launch never passes silently.
//  - Reductions are deterministic: a fixed order that does not depend on timing (no float
//    atomics), so a CUDA run repeats bit for bit.
// This header is included by host C++ (the dispatch in src/ops) and by .cu files; the device
// helpers are only visible to nvcc.
#pragma once
#include <cstdint>

#include <cuda_runtime.h>

#include "kernels/host_device.h"

namespace fsdpq::cuda {

enum class KType : uint8_t { F32, BF16, F16 };

// An output written row by row into a wider matrix (a dense weight into a block of a folded LoRA
// weight's columns, model/llama_layer.h): rows of `length` values, `stride` values apart. Value i
// of the rows goes to at(i); stride == length is a contiguous output.
struct RowPitch {
  int64_t length = 0, stride = 0;
  bool contiguous() const { return stride == length; }
  FSDPQ_HOST_DEVICE_INLINE int64_t at(int64_t i) const { return i / length * stride + i % length; }
};

// Throws std::runtime_error("CUDA kernel <name>: <error>") when the last launch failed.
void check_launch(const char* kernel);

}  // namespace fsdpq::cuda

#ifdef __CUDACC__
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <stdexcept>

namespace fsdpq::cuda {

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }

template <class T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16(v); }
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half(v); }

// The value v becomes once stored as T and read back.
template <class T>
__device__ __forceinline__ float round_to(float v) { return to_float(from_float<T>(v)); }

// Element i of an operand whose storage type is known only at run time: one uniform switch per
// element, for kernels that load each element once and then do O(T) work with it (attention),
// where instantiating every combination of operand types would cost more than it saves.
__device__ __forceinline__ float load_any(const void* p, KType t, int64_t i) {
  switch (t) {
    case KType::F32: return static_cast<const float*>(p)[i];
    case KType::BF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    default: return __half2float(static_cast<const __half*>(p)[i]);
  }
}

__device__ __forceinline__ void store_any(void* p, KType t, int64_t i, float v) {
  switch (t) {
    case KType::F32: static_cast<float*>(p)[i] = v; return;
    case KType::BF16: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16(v); return;
    default: static_cast<__half*>(p)[i] = __float2half(v); return;
  }
}

// Elements i and i + 1 as one store (8 bytes for F32, 4 for the 16-bit types): i even and p aligned
// to that size.
__device__ __forceinline__ void store_any_pair(void* p, KType t, int64_t i, float v0, float v1) {
  switch (t) {
    case KType::F32: *reinterpret_cast<float2*>(static_cast<float*>(p) + i) = make_float2(v0, v1); return;
    case KType::BF16:
      *reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(p) + i) = __floats2bfloat162_rn(v0, v1);
      return;
    default: *reinterpret_cast<__half2*>(static_cast<__half*>(p) + i) = __floats2half2_rn(v0, v1); return;
  }
}

// Calls fn(T{}) with the CUDA storage type of a KType (float, __nv_bfloat16, __half).
template <class Fn>
void with_ktype(KType type, Fn&& fn) {
  switch (type) {
    case KType::F32: fn(float{}); return;
    case KType::BF16: fn(__nv_bfloat16{}); return;
    case KType::F16: fn(__half{}); return;
  }
  throw std::logic_error("with_ktype: unknown KType");
}

// A grid-stride launch size: enough blocks to fill the GPU, never more than the work.
inline unsigned blocks_for(int64_t n, int threads = 256) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > 8192 ? 8192 : blocks));
}

}  // namespace fsdpq::cuda
#endif
