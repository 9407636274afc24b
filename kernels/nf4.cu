#include <cfloat>
#include <cstring>
#include <stdexcept>

#include "kernels/nf4.cuh"

namespace fsdpq::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kPerThread = 16;  // values per thread: 8 packed bytes in, 32 or 64 bytes out
constexpr int64_t kBlockSize = 64;
constexpr int64_t kGroupSize = 256;

// Both tables by value: they live in the kernel's parameter space, no upload needed.
struct Nf4Tables {
  float nf4[16];
  float code8[256];
};

// The CPU's flush_subnormal (bitsandbytes is built with --use_fast_math, which flushes).
__device__ __forceinline__ float flush(float x) { return fabsf(x) < FLT_MIN ? x * 0.0f : x; }

template <class T>
__device__ __forceinline__ uint32_t bits16(T v);
template <>
__device__ __forceinline__ uint32_t bits16<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat16_as_ushort(v); }
template <>
__device__ __forceinline__ uint32_t bits16<__half>(__half v) { return __half_as_ushort(v); }

// Stores 16 fp32 values (already final) as T with 16-byte stores; dst is 16-byte aligned.
template <class T>
__device__ __forceinline__ void store16(T* dst, const float (&w)[kPerThread]) {
  if constexpr (sizeof(T) == 4) {
    float4* d = reinterpret_cast<float4*>(dst);
#pragma unroll
    for (int i = 0; i < 4; ++i) d[i] = make_float4(w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3]);
  } else {
    uint32_t p[8];
#pragma unroll
    for (int i = 0; i < 8; ++i)
      p[i] = bits16<T>(from_float<T>(w[2 * i])) | bits16<T>(from_float<T>(w[2 * i + 1])) << 16;
    uint4* d = reinterpret_cast<uint4*>(dst);
    d[0] = make_uint4(p[0], p[1], p[2], p[3]);
    d[1] = make_uint4(p[4], p[5], p[6], p[7]);
  }
}

// kPitched: value i goes to out[pitch.at(i)] (a 16-value chunk never straddles a row where
// vector_ok); else to out[i].
template <class T, bool kPitched>
__global__ void __launch_bounds__(kThreads)
    nf4_dequantize_kernel(const uint8_t* __restrict__ packed, const float* __restrict__ absmax,
                          const uint8_t* __restrict__ absmax_q, const float* __restrict__ absmax_scale,
                          float absmax_offset, Nf4Tables tables, int64_t numel, T* __restrict__ out,
                          bool vector_ok, RowPitch pitch) {
  __shared__ float code[16];
  __shared__ float code8[256];
  if (threadIdx.x < 16) code[threadIdx.x] = tables.nf4[threadIdx.x];
  if (absmax_q != nullptr)
    for (int i = threadIdx.x; i < 256; i += blockDim.x) code8[i] = tables.code8[i];
  __syncthreads();

  const int64_t chunks = (numel + kPerThread - 1) / kPerThread;
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < chunks;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t first = c * kPerThread;  // a chunk never straddles a 64-value block
    const int64_t block = first / kBlockSize;
    float a;
    if (absmax_q != nullptr) {
      // nf4_double_dequantize_absmax: two separate fp32 roundings (no FMA contraction).
      a = flush(__fmul_rn(code8[absmax_q[block]], flush(absmax_scale[block / kGroupSize])));
      a = flush(__fadd_rn(a, absmax_offset));
    } else {
      a = absmax[block];
    }
    const float scale = flush(a);
    if (vector_ok && first + kPerThread <= numel) {
      const uint2 raw = *reinterpret_cast<const uint2*>(packed + first / 2);
      float w[kPerThread];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const uint32_t byte = ((j < 4 ? raw.x : raw.y) >> (8 * (j & 3))) & 0xffu;
        w[2 * j] = flush(__fmul_rn(code[byte >> 4], scale));
        w[2 * j + 1] = flush(__fmul_rn(code[byte & 0x0fu], scale));
      }
      store16(out + (kPitched ? pitch.at(first) : first), w);
    } else {
      const int64_t end = first + kPerThread < numel ? first + kPerThread : numel;
      for (int64_t i = first; i < end; ++i) {
        const uint32_t byte = packed[i / 2];
        const uint32_t q = (i & 1) ? (byte & 0x0fu) : (byte >> 4);
        out[kPitched ? pitch.at(i) : i] = from_float<T>(flush(__fmul_rn(code[q], scale)));
      }
    }
  }
}

}  // namespace

void nf4_dequantize(const uint8_t* packed, const float* absmax, const uint8_t* absmax_q,
                    const float* absmax_scale, float absmax_offset, const float* nf4_code16,
                    const float* code8_256, int64_t numel, void* out, KType out_type, RowPitch pitch,
                    cudaStream_t stream) {
  if (numel < 0) throw std::logic_error("cuda::nf4_dequantize: negative numel");
  if (numel == 0) return;
  const bool double_quant = absmax_q != nullptr;
  if (double_quant == (absmax != nullptr) || (double_quant && (absmax_scale == nullptr || code8_256 == nullptr)) ||
      nf4_code16 == nullptr || packed == nullptr || out == nullptr)
    throw std::logic_error("cuda::nf4_dequantize: pass either absmax or absmax_q + absmax_scale (and the code tables)");
  Nf4Tables tables{};
  std::memcpy(tables.nf4, nf4_code16, sizeof tables.nf4);
  if (double_quant) std::memcpy(tables.code8, code8_256, sizeof tables.code8);
  if (pitch.length <= 0 || numel % pitch.length != 0 || pitch.stride < pitch.length)
    throw std::logic_error("cuda::nf4_dequantize: the output's rows must divide the weight and fit their stride");
  // The vector path loads 8 packed bytes and stores 16-byte words: whole chunks of a row, each
  // starting 16 bytes aligned.
  const size_t element = out_type == KType::F32 ? 4 : 2;
  const bool vector_ok = reinterpret_cast<uintptr_t>(packed) % 8 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0 &&
                         (pitch.contiguous() ||
                          (pitch.length % kPerThread == 0 && static_cast<size_t>(pitch.stride) * element % 16 == 0));
  const int64_t chunks = (numel + kPerThread - 1) / kPerThread;
  const unsigned grid = blocks_for(chunks, kThreads);
  with_ktype(out_type, [&](auto tag) {
    using T = decltype(tag);
    if (pitch.contiguous())
      nf4_dequantize_kernel<T, false><<<grid, kThreads, 0, stream>>>(
          packed, absmax, absmax_q, absmax_scale, absmax_offset, tables, numel, static_cast<T*>(out), vector_ok, pitch);
    else
      nf4_dequantize_kernel<T, true><<<grid, kThreads, 0, stream>>>(
          packed, absmax, absmax_q, absmax_scale, absmax_offset, tables, numel, static_cast<T*>(out), vector_ok, pitch);
  });
  check_launch("nf4_dequantize");
}

}  // namespace fsdpq::cuda
